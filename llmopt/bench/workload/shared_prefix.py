"""The shared-prefix workload: what a system prompt or a few-shot header looks like to a server."""

from __future__ import annotations

import random

from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.random import random_prompts
from llmopt.bench.workload.text import corpus_token_ids, count_tokens, text_of_length


def shared_prefix_prompts(
    tokenizer,
    num: int,
    prefix_len: int,
    num_prefixes: int,
    prompt_len: int,
    output_len: int,
    seed: int = 0,
    spread: float = 0.0,
) -> list[BenchRequest]:
    """Prompts made of one of `num_prefixes` shared prefixes (`prefix_len` tokens) and a unique
    suffix of `prompt_len` tokens."""
    ids = corpus_token_ids(tokenizer)
    rng = random.Random(seed)
    prefixes = []
    for _ in range(num_prefixes):
        start = rng.randrange(0, max(1, len(ids) - 2 * prefix_len - 1))
        prefixes.append(text_of_length(tokenizer, ids[start : start + 2 * prefix_len + 8], prefix_len))
    suffixes = random_prompts(tokenizer, num, prompt_len, output_len, seed + 1, spread)
    out = []
    for i, suffix in enumerate(suffixes):
        prompt = prefixes[i % num_prefixes] + "\n" + suffix.prompt
        out.append(
            BenchRequest(prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt))
        )
    return out
