"""The random workload: prompts of an exact token length cut from random places of the corpus."""

from __future__ import annotations

import random

from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.text import corpus_token_ids, text_of_length


def random_prompts(
    tokenizer, num: int, prompt_len: int, output_len: int, seed: int = 0, spread: float = 0.0
) -> list[BenchRequest]:
    """`num` prompts of exactly `prompt_len` tokens from random places of the corpus; with `spread`,
    each prompt's length is drawn uniformly from prompt_len * (1 ± spread) (at least 1 token)."""
    assert 0 <= spread < 1
    ids = corpus_token_ids(tokenizer)
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        length = prompt_len
        if spread:
            low, high = round(prompt_len * (1 - spread)), round(prompt_len * (1 + spread))
            length = max(1, rng.randint(low, high))
        start = rng.randrange(0, max(1, len(ids) - 2 * length - 1))
        text = text_of_length(tokenizer, ids[start : start + 2 * length + 8], length)
        out.append(BenchRequest(prompt=text, max_tokens=output_len, prompt_tokens=length))
    return out
