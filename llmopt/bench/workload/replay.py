"""The replay workload: a trace's requests (trace.py) as prompts, sent at the trace's times (runner.py).

A hash id's block is `block_size` tokens of the corpus, cut at a place that the id and the point's seed
pick, so one id is one text in every request of a point: requests that share leading ids share a prompt
prefix, which a prefix cache serves as it would in production, while another point (another seed) gets
texts of its own. A prompt is its ids' blocks in order, the last cut to `input_length`; tokens the ids do
not cover are text of the request's own. Its token count is measured, since a seam between two blocks
may tokenize into a token more or less than the blocks apart."""

from __future__ import annotations

import random

from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.text import corpus_token_ids, count_tokens
from llmopt.bench.workload.trace import TraceEntry


class BlockTexts:
    """The texts of one point's blocks, each cut once and kept."""

    def __init__(self, tokenizer, block_size: int, seed: int):
        assert block_size >= 1
        self.tokenizer, self.block_size, self.seed = tokenizer, block_size, seed
        self.ids = corpus_token_ids(tokenizer)
        self.blocks: dict[int, list[int]] = {}

    def cut(self, key: str, length: int) -> list[int]:
        """`length` corpus tokens from the place that `key` picks (the corpus repeated if too short)."""
        ids = self.ids * (length // len(self.ids) + 2) if length >= len(self.ids) else self.ids
        start = random.Random(f"{self.seed}:{key}").randrange(0, len(ids) - length)
        return ids[start : start + length]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def prompt(self, entry: TraceEntry, index: int) -> str:
        """Request `index`'s prompt: its hash ids' blocks, then text of its own up to `input_length`."""
        pieces, left = [], entry.input_length
        for hash_id in entry.hash_ids:
            if left <= 0:
                break
            if hash_id not in self.blocks:
                self.blocks[hash_id] = self.cut(f"block {hash_id}", self.block_size)
            take = min(left, self.block_size)
            pieces.append(self.decode(self.blocks[hash_id][:take]))
            left -= take
        if left > 0:
            pieces.append(self.decode(self.cut(f"request {index}", left)))
        return join(pieces)


def join(pieces: list[str]) -> str:
    """The pieces in order, a space between two that would otherwise run into one word. The same
    leading pieces make the same leading text, whatever follows."""
    out = ""
    for piece in pieces:
        if out and piece and not out[-1].isspace() and not piece[0].isspace():
            out += " "
        out += piece
    return out


def replay_prompts(
    tokenizer, entries: list[TraceEntry], block_size: int, seed: int = 0, num: int | None = None
) -> list[BenchRequest]:
    """The first `num` (default: all) requests of a trace, each asking for its `output_length` tokens."""
    blocks = BlockTexts(tokenizer, block_size, seed)
    out = []
    for index, entry in enumerate(entries[:num] if num else entries):
        prompt = blocks.prompt(entry, index)
        out.append(
            BenchRequest(
                prompt=prompt, max_tokens=entry.output_length, prompt_tokens=count_tokens(tokenizer, prompt)
            )
        )
    return out
