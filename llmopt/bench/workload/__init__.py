"""Workloads: prompts of an exact token length (random), shared-prefix sets, copy-heavy sets, and
prompts from JSONL or ShareGPT files. Lengths are measured with the model's tokenizer (the bundled one
by default). `WORKLOADS` names them as a recipe's `kind` and `--workload` do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from llmopt.bench.client import BenchRequest
from llmopt.bench.workload.copy import copy_heavy_prompts
from llmopt.bench.workload.file import file_prompts
from llmopt.bench.workload.random import random_prompts
from llmopt.bench.workload.shared_prefix import shared_prefix_prompts
from llmopt.bench.workload.text import corpus_token_ids, count_tokens, text_of_length

if TYPE_CHECKING:  # config.py imports WORKLOADS from here
    from llmopt.bench.config import BenchConfig

__all__ = [
    "WORKLOADS",
    "copy_heavy_prompts",
    "corpus_token_ids",
    "count_tokens",
    "file_prompts",
    "make_requests",
    "random_prompts",
    "shared_prefix_prompts",
    "text_of_length",
]

# (config, tokenizer, number of requests, prompt length, output length, seed) -> requests
Builder = Callable[["BenchConfig", object, int, int, int, int], list[BenchRequest]]

BUILDERS: dict[str, Builder] = {
    "random": lambda config, tok, n, pl, ol, seed: random_prompts(tok, n, pl, ol, seed),
    "shared-prefix": lambda config, tok, n, pl, ol, seed: shared_prefix_prompts(
        tok, n, config.prefix_len or pl, config.num_prefixes, pl, ol, seed
    ),
    "copy": lambda config, tok, n, pl, ol, seed: copy_heavy_prompts(tok, n, pl, ol, seed),
    "file": lambda config, tok, n, pl, ol, seed: file_prompts(Path(config.dataset), tok, ol, n),
}
WORKLOADS = tuple(BUILDERS)


def make_requests(
    config: BenchConfig, tokenizer, prompt_len: int, output_len: int, seed: int, num: int | None = None
) -> list[BenchRequest]:
    """`num` requests (default: the config's count) of the config's workload."""
    return BUILDERS[config.workload](
        config, tokenizer, num or config.num_requests, prompt_len, output_len, seed
    )
