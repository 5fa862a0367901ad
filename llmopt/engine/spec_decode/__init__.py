"""Speculative decoding: propose k tokens cheaply, verify them in one forward of the target model.

Proposers: `ngram` (prompt lookup: the tokens that followed the latest earlier occurrence of the
context's last n tokens) and `draft` (a smaller or cheaper model with its own paged KV cache, proposing
autoregressively). Verification keeps the target's distribution exactly: greedy accepts while the
proposal equals the target's argmax; sampling accepts token x with probability min(1, p(x)/q(x)), on the
first rejection samples from norm(max(p - q, 0)), and adds a bonus token when all k are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.sampler import ban_stop_tokens, greedy_tokens, probabilities
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig

METHODS = ("ngram", "draft")


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2  # single-token matches are mostly noise in free text
    prompt_lookup_max: int = 4
    model: str | None = None  # the draft model: any model llmopt loads

    @classmethod
    def parse(cls, value: str | dict | None) -> SpeculativeConfig | None:
        """From vLLM-style JSON, e.g. '{"method": "ngram", "num_speculative_tokens": 4}'."""
        if value is None or value == "":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative config is not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValueError("speculative config must be a JSON object")
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown speculative config keys: {', '.join(sorted(unknown))}")
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, not {method!r}")
        k = value.get("num_speculative_tokens")
        if not isinstance(k, int) or k < 1:
            raise ValueError("num_speculative_tokens must be an integer >= 1")
        config = cls(
            method,
            k,
            value.get("prompt_lookup_min", 1),
            value.get("prompt_lookup_max", 4),
            value.get("model"),
        )
        if not 1 <= config.prompt_lookup_min <= config.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if method == "draft" and not config.model:
            raise ValueError('the draft method needs "model": a model folder, .gguf file or alias')
        return config


@dataclass
class Proposal:
    tokens: list[int]
    draft_probs: torch.Tensor | None = None  # [k, vocab] for a draft model's sampled proposals; None: one-hot


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        return [Proposal(self.lookup(seq.token_ids, k)) for seq, k in zip(seqs, ks)]

    def release(self, request_id: str) -> None:
        """Nothing to free: n-gram lookups keep no per-request state."""

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest suffix n-gram."""
        context = np.asarray(token_ids)
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)
            matches = np.flatnonzero((windows == context[-n:]).all(axis=1))
            if len(matches):
                start = int(matches[-1]) + n
                return context[start : start + k].tolist()
        return []


@dataclass
class DraftState:
    """A sequence's place in the draft model's own KV cache."""

    token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)


class DraftProposer:
    """Runs a second model with its own paged KV cache; k batched single-token steps per engine step."""

    def __init__(
        self, config: SpeculativeConfig, engine_config: EngineConfig, vocab_size: int, max_model_len: int
    ):
        from llmopt.checkpoints import resolve_model
        from llmopt.engine.model_runner import ModelRunner

        draft_config = replace(engine_config, model=config.model, enable_prefix_caching=False)
        self.runner = ModelRunner(draft_config, resolve_model(config.model), max_model_len)
        draft_vocab = self.runner.model.config.vocab_size
        if draft_vocab != vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_vocab}) differs from the target's ({vocab_size})"
            )
        self.block_manager = BlockManager(self.runner.num_kv_blocks, engine_config.block_size, False)
        self.states: dict[str, DraftState] = {}

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        bm = self.block_manager
        active: list[tuple[int, DraftState]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            state = self.states.setdefault(seq.request_id, DraftState())
            state.token_ids = list(seq.token_ids)
            state.num_computed_tokens = min(state.num_computed_tokens, len(seq) - 1)
            if bm.blocks_needed(state, len(seq) + k) <= bm.num_free_blocks:
                bm.allocate(state, len(seq) + k)
                active.append((i, state))
        tokens: dict[int, list[int]] = {i: [] for i, _ in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in active}
        for step in range(max((ks[i] for i, _ in active), default=0)):
            running = [(i, s) for i, s in active if step < ks[i]]
            batch = ScheduledBatch(
                [s for _, s in running], [len(s.token_ids) - s.num_computed_tokens for _, s in running]
            )
            logits = self.runner.run(batch, [1] * len(running))
            for row, (i, state) in enumerate(running):
                seq = seqs[i]
                params = seq.params
                row_logits = logits[row : row + 1]
                if params.greedy:
                    [token] = greedy_tokens(row_logits)
                else:
                    p = probabilities(row_logits, params)
                    token = int(torch.multinomial(p[0], 1, generator=seq.generator))
                    probs[i].append(p[0])
                state.num_computed_tokens = len(state.token_ids)
                state.token_ids.append(token)
                tokens[i].append(token)
        proposals = [Proposal([]) for _ in seqs]
        for i, _ in active:
            proposals[i] = Proposal(tokens[i], torch.stack(probs[i]) if probs[i] else None)
        return proposals

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.block_manager.free(state)


def make_proposer(
    config: SpeculativeConfig, engine_config: EngineConfig, vocab_size: int, max_model_len: int
):
    if config.method == "ngram":
        return NgramProposer(config)
    return DraftProposer(config, engine_config, vocab_size, max_model_len)


def verify(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    seq: Sequence,
    stop_ids: set[int],
) -> tuple[list[int], int]:
    """Check proposed tokens against the target's logits [k + 1, vocab] (row i predicts the token after
    proposal i - 1). `draft_probs` [k, vocab] are the draft's sampling distributions (None: the
    proposals were certain, as n-gram lookups are). Return the tokens to append (accepted ones, then a
    corrected or bonus token) and how many proposals were accepted."""
    params = seq.params
    ban_stop_tokens(logits, stop_ids, params, seq.num_output_tokens)
    if params.greedy:
        target = greedy_tokens(logits)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == target[accepted]:
            accepted += 1
        return draft[:accepted] + [target[accepted]], accepted
    p = probabilities(logits, params)
    out: list[int] = []
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand((), generator=seq.generator))
        if u < min(1.0, float(p[i, x]) / q_x):
            out.append(x)
            continue
        # Rejected: sample from the part of p that q does not cover.
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0
        else:
            residual = (p[i] - draft_probs[i]).clamp_min(0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p[i]
        out.append(int(torch.multinomial(residual, 1, generator=seq.generator)))
        return out, i
    out.append(int(torch.multinomial(p[len(draft)], 1, generator=seq.generator)))
    return out, len(draft)


@dataclass
class SpecStats:
    drafts: int = 0  # verification steps that had at least one proposed token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    proposed_at: list[int] = field(default_factory=list)  # per position: how often a token was proposed
    accepted_at: list[int] = field(default_factory=list)  # ... and accepted

    def record(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        while len(self.proposed_at) < proposed:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for i in range(proposed):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens each verification step yields: the accepted ones plus the one the target adds."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else 0.0

    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]
