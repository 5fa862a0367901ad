"""Logprobs in a response: the engine's records (token ids and numbers, engine/token_logprobs.py) written in
the endpoint's shape, with each token's text and bytes. Chat: `{"content": [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}`. Completions (OpenAI's legacy shape): `{tokens,
token_logprobs, top_logprobs: [{text: logprob}], text_offset}`, with echo's prompt tokens first (the
first one's logprob and top_logprobs null). vLLM's `prompt_logprobs`: one entry per prompt token, the
first null, each other `{token id: {logprob, rank, decoded_token}}` of the prompt's token and the k most
likely. Also the text echo starts each choice with (completions: the prompt; chat: the assistant's
last message)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from llmopt.engine.outputs import RequestOutput
from llmopt.engine.token_logprobs import TokenLogprob

SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte-fallback token


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, backwards: the character such a vocabulary writes for each
    byte, to that byte (the tokens of GPT-2, Llama 3, Qwen and SmolLM2 are spelled in it)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    chars = kept + [256 + i for i in range(len(moved))]
    return {chr(c): b for b, c in zip(kept + moved, chars)}


class TokenTexts:
    """Each token's text and bytes as logprobs show them, looked up once (one per server: a vocabulary
    is finite). The bytes are the token's own, so a character split across tokens adds up; the text is
    the token decoded alone (such a half character shows as U+FFFD, as vLLM shows it)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = tokenizer.convert_tokens_to_ids("Ġ") not in (None, tokenizer.unk_token_id)
        self._found: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        found = self._found.get(token_id)
        if found is None:
            found = self._found[token_id] = self._look_up(token_id)
        return found

    def _look_up(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode(
            [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        alphabet = byte_level_alphabet()
        if (byte := SENTENCEPIECE_BYTE.fullmatch(piece)) is not None:
            raw = bytes([int(byte[1], 16)])
        elif self.byte_level and piece and all(c in alphabet for c in piece):
            raw = bytes(alphabet[c] for c in piece)
        else:
            raw = text.encode()
        return text, list(raw)


@dataclass
class LogprobsWriter:
    """The logprobs (and echo's prompt text) of one response's choices. Mutable: a stream's legacy
    `text_offset` continues from chunk to chunk, and a JSON body collects every output first."""

    token_texts: TokenTexts
    legacy: bool  # completions' shape, else chat's
    wanted: bool  # logprobs were asked for (echo alone needs none)
    echo: list[str] | None = None  # echo: the text each choice starts with
    num_top: int | None = None  # the most likely tokens each logprobs entry lists (None: as recorded)
    prompt_top: int | None = None  # prompt_logprobs' k (None: not asked for)
    _prompts: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    _offsets: dict[int, int] = field(default_factory=dict)
    _collected: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    _echoed: set[int] = field(default_factory=set)

    def take_echo(self, index: int) -> str:
        """The text choice `index` starts with: its prompt (with echo) the first time, then nothing."""
        if self.echo is None or index in self._echoed:
            return ""
        self._echoed.add(index)
        return self.echo[index]

    def records(self, out: RequestOutput) -> list[TokenLogprob]:
        """What `out` adds to its choice's logprobs: with echo, the prompt's (on the first output), then
        its new tokens'."""
        echoed = self.legacy and self.echo is not None  # chat's echo is text alone, as in vLLM
        prompt = out.prompt_logprobs if echoed and out.prompt_logprobs else []
        return [*prompt, *(out.logprobs or [])]

    def chunk(self, index: int, out: RequestOutput) -> dict | None:
        """The logprobs of one stream chunk (None: nothing to add)."""
        records = self.records(out) if self.wanted else []
        return self.render(index, records) if records else None

    def collect(self, index: int, out: RequestOutput) -> None:
        if self.prompt_top is not None and out.prompt_logprobs:
            self._prompts[index] = out.prompt_logprobs
        if self.wanted:
            self._collected.setdefault(index, []).extend(self.records(out))

    def whole(self, index: int) -> dict | None:
        """The logprobs of a finished choice in a JSON body."""
        return self.render(index, self._collected.get(index, [])) if self.wanted else None

    def prompt_logprobs(self, index: int) -> list[dict | None] | None:
        """vLLM's `prompt_logprobs` of choice `index` (None: not asked for)."""
        if self.prompt_top is None:
            return None
        return [self._prompt_entry(r) for r in self._prompts.get(index, [])]

    def _prompt_entry(self, record: TokenLogprob) -> dict | None:
        if record.logprob is None:  # the first prompt token: nothing before it predicts it
            return None
        entry = {str(record.token_id): self._ranked(record.token_id, record.logprob, record.rank)}
        for rank, (token_id, logprob) in enumerate((record.top or [])[: self.prompt_top], 1):
            entry.setdefault(str(token_id), self._ranked(token_id, logprob, rank))
        return entry

    def _ranked(self, token_id: int, logprob: float, rank: int | None) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.token_texts(token_id)[0]}

    def render(self, index: int, records: list[TokenLogprob]) -> dict:
        if self.legacy:
            return self._legacy(index, records)
        return {"content": [self._chat(r) for r in records]}

    def _chat(self, record: TokenLogprob) -> dict:
        text, raw = self.token_texts(record.token_id)
        top = [self._chat_top(token_id, logprob) for token_id, logprob in record.top or []]
        return {"token": text, "logprob": record.logprob, "bytes": raw, "top_logprobs": top}

    def _chat_top(self, token_id: int, logprob: float) -> dict:
        text, raw = self.token_texts(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    def _legacy(self, index: int, records: list[TokenLogprob]) -> dict:
        tokens: list[str] = []
        offsets: list[int] = []
        offset = self._offsets.get(index, 0)
        for record in records:
            text = self.token_texts(record.token_id)[0]
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        self._offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": [r.logprob for r in records],
            "top_logprobs": [self._legacy_top(r, text) for r, text in zip(records, tokens)],
            "text_offset": offsets,
        }

    def _legacy_top(self, record: TokenLogprob, text: str) -> dict[str, float] | None:
        """{text: logprob} of the most likely tokens, and of the chosen one (OpenAI: "up to logprobs + 1
        elements"); where two tokens decode alike, the likelier one's number stays."""
        if record.top is None:
            return None
        top: dict[str, float] = {}
        for token_id, logprob in record.top[: self.num_top]:
            top.setdefault(self.token_texts(token_id)[0], logprob)
        top.setdefault(text, record.logprob)
        return top
