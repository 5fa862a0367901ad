"""Workloads: prompts of an exact token length (random), shared-prefix sets, copy-heavy sets, prompts
from JSONL or ShareGPT files, and a trace's requests (replay); and multi-turn sessions: synthetic chats
(multi-turn), agent loops with tools (agent), and conversations from a file. Lengths are measured with
the model's tokenizer (the bundled one by default). `WORKLOADS` names them as a recipe's `kind` and
`--workload` do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmopt.bench.settings import WorkloadSettings
from llmopt.bench.workload.agent import agent_conversations
from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.conversation import Conversation
from llmopt.bench.workload.conversation_file import file_conversations
from llmopt.bench.workload.copy import copy_heavy_prompts
from llmopt.bench.workload.file import file_prompts
from llmopt.bench.workload.multi_turn import multi_turn_conversations
from llmopt.bench.workload.random import random_prompts
from llmopt.bench.workload.replay import replay_prompts
from llmopt.bench.workload.shared_prefix import shared_prefix_prompts
from llmopt.bench.workload.text import corpus_token_ids, count_tokens, text_of_length
from llmopt.bench.workload.trace import read_trace

__all__ = [
    "SESSION_WORKLOADS",
    "WORKLOADS",
    "agent_conversations",
    "copy_heavy_prompts",
    "corpus_token_ids",
    "count_tokens",
    "file_conversations",
    "file_prompts",
    "make_conversations",
    "make_requests",
    "multi_turn_conversations",
    "random_prompts",
    "replay_prompts",
    "shared_prefix_prompts",
    "text_of_length",
]

# (config, tokenizer, number of requests, prompt length, output length, seed) -> requests
Builder = Callable[["WorkloadSettings", object, int, int, int, int], list[BenchRequest]]

BUILDERS: dict[str, Builder] = {
    "random": lambda config, tok, n, pl, ol, seed: random_prompts(
        tok, n, pl, ol, seed, config.prompt_len_spread
    ),
    "shared-prefix": lambda config, tok, n, pl, ol, seed: shared_prefix_prompts(
        tok, n, config.prefix_len or pl, config.num_prefixes, pl, ol, seed, config.prompt_len_spread
    ),
    "copy": lambda config, tok, n, pl, ol, seed: copy_heavy_prompts(
        tok, n, pl, ol, seed, config.prompt_len_spread
    ),
    "file": lambda config, tok, n, pl, ol, seed: file_prompts(Path(config.dataset), tok, ol, n),
    # A trace's own lengths, not the prompt and output length axes; its times are the point's arrivals.
    "replay": lambda config, tok, n, pl, ol, seed: replay_prompts(
        tok, read_trace(Path(config.trace)), config.trace_block_size, seed, n
    ),
}

# (config, tokenizer, number of sessions, turn length, output length, seed) -> sessions
SessionBuilder = Callable[["WorkloadSettings", object, int, int, int, int], list[Conversation]]

SESSION_BUILDERS: dict[str, SessionBuilder] = {
    "multi-turn": lambda config, tok, n, tl, ol, seed: multi_turn_conversations(
        tok, n, config.system_len, tl, ol, config.turns, seed, config.prompt_len_spread
    ),
    "agent": lambda config, tok, n, tl, ol, seed: agent_conversations(
        tok, n, config.system_len, tl, ol, config.turns, seed, config.prompt_len_spread, config.agent_tools
    ),
    # A file's conversations, all of them: the sweep takes as many as hold --num-requests turns.
    "conversations": lambda config, tok, n, tl, ol, seed: file_conversations(Path(config.dataset), tok, ol),
}
SESSION_WORKLOADS = tuple(SESSION_BUILDERS)
WORKLOADS = tuple(BUILDERS) + SESSION_WORKLOADS
# Workloads that send the same prompts at every point: a prefix cache an earlier point warmed serves them.
REPEATING_WORKLOADS = ("file", "conversations")


def make_requests(
    config: WorkloadSettings, tokenizer, prompt_len: int, output_len: int, seed: int, num: int
) -> list[BenchRequest]:
    """`num` requests of the config's workload."""
    return BUILDERS[config.kind](config, tokenizer, num, prompt_len, output_len, seed)


def make_conversations(
    config: WorkloadSettings, tokenizer, turn_len: int, output_len: int, seed: int, num: int
) -> list[Conversation]:
    """`num` sessions of the config's multi-turn workload (a file's: every one it holds)."""
    return SESSION_BUILDERS[config.kind](config, tokenizer, num, turn_len, output_len, seed)
