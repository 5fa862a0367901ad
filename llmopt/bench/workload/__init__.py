"""Workloads: prompts of an exact token length, shared-prefix sets, copy-heavy sets, and prompts from
JSONL or ShareGPT files. Lengths are measured with the model's tokenizer (the bundled one by default)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from llmopt.bench.client import BenchRequest
from llmopt.corpus import default_text
from llmopt.files import jsonl_records


def corpus_token_ids(tokenizer) -> list[int]:
    """The default corpus (llmopt/corpus.py), tokenized."""
    return tokenizer.encode(default_text(), add_special_tokens=False)


def text_of_length(tokenizer, ids: list[int], length: int) -> str:
    """Text that the tokenizer encodes to exactly `length` tokens, cut from `ids`."""
    if length <= 0:
        return ""

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    def decode(n: int) -> str:
        return tokenizer.decode(ids[:n], skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # Decoding and re-encoding can merge or split tokens at the cut: try cuts around `length` first.
    candidates = [decode(n) for n in range(max(1, length - 4), min(len(ids), length + 4) + 1)]
    for text in candidates:
        if count(text) == length:
            return text
    text = candidates[-1]
    for _ in range(64):  # then trim characters, or pad with single-token words, until it fits
        n = count(text)
        if n == length:
            return text
        text = text[:-1] if n > length else text + " a"
    raise ValueError(f"could not build a prompt of exactly {length} tokens")


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def random_prompts(
    tokenizer, num: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[BenchRequest]:
    """`num` prompts of exactly `prompt_len` tokens from random places of the corpus."""
    ids = corpus_token_ids(tokenizer)
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        start = rng.randrange(0, max(1, len(ids) - 2 * prompt_len - 1))
        text = text_of_length(tokenizer, ids[start : start + 2 * prompt_len + 8], prompt_len)
        out.append(BenchRequest(prompt=text, max_tokens=output_len, prompt_tokens=prompt_len))
    return out


def shared_prefix_prompts(
    tokenizer, num: int, prefix_len: int, num_prefixes: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[BenchRequest]:
    """Prompts made of one of `num_prefixes` shared prefixes (`prefix_len` tokens) and a unique
    suffix of `prompt_len` tokens: what a system prompt or a few-shot header looks like to a server."""
    ids = corpus_token_ids(tokenizer)
    rng = random.Random(seed)
    prefixes = []
    for _ in range(num_prefixes):
        start = rng.randrange(0, max(1, len(ids) - 2 * prefix_len - 1))
        prefixes.append(text_of_length(tokenizer, ids[start : start + 2 * prefix_len + 8], prefix_len))
    suffixes = random_prompts(tokenizer, num, prompt_len, output_len, seed + 1)
    out = []
    for i, suffix in enumerate(suffixes):
        prompt = prefixes[i % num_prefixes] + "\n" + suffix.prompt
        out.append(
            BenchRequest(prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt))
        )
    return out


def copy_heavy_prompts(
    tokenizer, num: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[BenchRequest]:
    """Requests whose answer repeats the prompt (edit/copy tasks): the best case for n-gram speculation."""
    out = []
    for req in random_prompts(tokenizer, num, prompt_len, output_len, seed):
        prompt = f"Repeat the following text exactly, word for word:\n\n{req.prompt}\n\nRepeated text:\n"
        out.append(
            BenchRequest(prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt))
        )
    return out


def file_prompts(
    path: Path, tokenizer, default_output_len: int, num: int | None = None
) -> list[BenchRequest]:
    """JSONL lines of {"prompt" | "messages", "max_tokens"?}, or a ShareGPT JSON file (a list of
    {"conversations": [{"from": "human"|"gpt", "value"}...]}: the first human turn is the prompt and
    the first answer's length the output length, as `vllm bench serve` does)."""
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    text = path.read_text()
    out: list[BenchRequest] = []
    if text.lstrip().startswith("["):
        for conv in json.loads(text):
            turns = conv.get("conversations") or conv.get("conversation") or []
            if len(turns) < 2:
                continue
            prompt, answer = turns[0].get("value", ""), turns[1].get("value", "")
            output_len = max(1, count_tokens(tokenizer, answer))
            out.append(
                BenchRequest(
                    prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt)
                )
            )
    else:
        for n, item in jsonl_records(path, text):
            if not isinstance(item, dict) or not ({"prompt", "messages"} & set(item)):
                raise ValueError(f'{path}:{n}: each line needs "prompt" or "messages"')
            messages = item.get("messages")
            prompt = item.get("prompt")
            content = prompt if prompt is not None else " ".join(m.get("content", "") for m in messages)
            out.append(
                BenchRequest(
                    prompt=prompt,
                    messages=messages,
                    max_tokens=int(item.get("max_tokens", default_output_len)),
                    prompt_tokens=count_tokens(tokenizer, content),
                )
            )
    if not out:
        raise ValueError(f"{path} holds no usable prompts")
    return out[:num] if num else out
