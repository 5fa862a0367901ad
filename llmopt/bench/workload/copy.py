"""The copy workload: answers that repeat the prompt (edit and copy tasks), the best case for n-gram
speculation."""

from __future__ import annotations

from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.random import random_prompts
from llmopt.bench.workload.text import count_tokens


def copy_heavy_prompts(
    tokenizer, num: int, prompt_len: int, output_len: int, seed: int = 0, spread: float = 0.0
) -> list[BenchRequest]:
    """Requests asking to repeat a random text of `prompt_len` tokens word for word."""
    out = []
    for req in random_prompts(tokenizer, num, prompt_len, output_len, seed, spread):
        prompt = f"Repeat the following text exactly, word for word:\n\n{req.prompt}\n\nRepeated text:\n"
        out.append(
            BenchRequest(prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt))
        )
    return out
