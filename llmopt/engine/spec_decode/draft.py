"""A draft model with its own paged KV cache, proposing autoregressively (k batched one-token steps)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.sampler import greedy_tokens, probabilities, sampleable
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.proposal import Proposal

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig


# A draft step that computes at most this many tokens a sequence costs about what a one-token step does:
# a sequence proposing every step catches up its accepted tokens and the target's own (1 + accepted).
CAUGHT_UP = 4


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
        # The last call's seconds per one-token step (None: it had none): what a position costs, apart
        # from catching up the tokens a sequence gained since it last proposed (a prefill of them).
        self.step_seconds: float | None = None

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        bm = self.block_manager
        active: list[tuple[int, DraftState]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            state = self.states.setdefault(seq.request_id, DraftState())
            state.token_ids = list(seq.token_ids)
            state.num_computed_tokens = min(state.num_computed_tokens, len(seq) - 1)
            if bm.allocate(state, len(seq) + k):
                active.append((i, state))
        one_token_steps: list[float] = []
        tokens: dict[int, list[int]] = {i: [] for i, _ in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in active}
        for step in range(max((ks[i] for i, _ in active), default=0)):
            running = [(i, s) for i, s in active if step < ks[i]]
            batch = ScheduledBatch(
                [s for _, s in running], [len(s.token_ids) - s.num_computed_tokens for _, s in running]
            )
            start = time.perf_counter()
            logits = self.runner.run(batch, [1] * len(running))
            if max(batch.num_new_tokens) <= CAUGHT_UP:
                one_token_steps.append(time.perf_counter() - start)
            for row, (i, state) in enumerate(running):
                seq = seqs[i]
                params = seq.params
                row_logits = logits[row : row + 1]
                if params.greedy:
                    [token] = greedy_tokens(row_logits)
                else:
                    p = probabilities(row_logits, params)
                    if not sampleable(p):  # any q keeps the verifier exact; one-hot is always valid
                        p = torch.nn.functional.one_hot(row_logits.argmax(-1), p.shape[-1]).float()
                    token = int(torch.multinomial(p[0], 1, generator=seq.generator))
                    probs[i].append(p[0])
                state.num_computed_tokens = len(state.token_ids)
                state.token_ids.append(token)
                tokens[i].append(token)
        self.step_seconds = sum(one_token_steps) / len(one_token_steps) if one_token_steps else None
        proposals = [Proposal([]) for _ in seqs]
        for i, _ in active:
            proposals[i] = Proposal(tokens[i], torch.stack(probs[i]) if probs[i] else None)
        return proposals

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.block_manager.free(state)
