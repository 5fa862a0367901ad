from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import torch

from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.token_logprobs import TokenLogprob

if TYPE_CHECKING:
    from llmopt.engine.structured.sequence_grammar import SequenceGrammar


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine: its tokens, KV blocks, sampling state and timings."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, seed: int):
        assert prompt_token_ids, "a sequence needs at least one prompt token"
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # Hashes of this sequence's full blocks that are in the prefix cache, in order.
        self.block_hashes: list[int] = []
        # Chained hashes of its full token blocks, whether cached or not (BlockManager.hashes' memo: a
        # waiting sequence is looked up every step, and its tokens only grow, or are cut at a stop).
        self.prefix_hashes: list[int] = []
        self.prefix_digests: list[bytes] = []  # the same blocks' disk-tier names (BlockManager.digests)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.spec_token_ids: list[int] = []  # proposed tokens this step verifies (speculative decoding)
        self.spec_draft_probs: torch.Tensor | None = None  # the draft model's distributions, when sampled
        self.spec_num_forced = 0  # how many of the proposals are tokens its grammar forces
        self.grammar: SequenceGrammar | None = None  # its structured output (set by the engine)
        # Its proposals' recent acceptance (positions accepted, positions tested) and, while they do not
        # pay, its pause before the next probe (spec_decode/policy.py).
        self.spec_passed = self.spec_tested = 0.0
        self.spec_passed_total = self.spec_tested_total = 0  # the same, all its verifications alike
        self.spec_skip = 0
        self.spec_probe_interval = 0  # 0: the first pause's (policy.PROBE_INTERVAL)
        self.spec_probe_due = False
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.num_disk_cached_tokens = 0  # of those, loaded from its disk tier
        self.num_preemptions = 0
        self.finish_reason: str | None = None  # "stop", "length", "abort" or "error"
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator().manual_seed(params.seed if params.seed is not None else seed)
        self.arrival_time = time.perf_counter()
        self.first_scheduled_time: float | None = None  # its first step (queue time: from arrival)
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        # Prompt logprobs by position, filled chunk by chunk while prefilling; handed out (and dropped
        # here) with the first output.
        self.prompt_logprobs: list[TokenLogprob] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs are asked for and the prompt is not yet scored: every prompt position needs its
        logits row, so none of it may come from the prefix cache (vLLM skips the cache for these too)."""
        return self.params.prompt_logprobs is not None and self.num_output_tokens == 0
