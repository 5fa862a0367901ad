"""A draft model with its own paged KV cache and prefix cache, proposing autoregressively (k batched
one-token steps)."""

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
from llmopt.engine.spec_decode.step_cost import smoothed

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig


# A draft step that computes at most this many tokens a sequence costs about what a one-token step does:
# a sequence proposing every step catches up its accepted tokens and the target's own (1 + accepted).
CAUGHT_UP = 4


@dataclass
class DraftState:
    """A sequence's place in the draft model's own KV cache (what BlockManager reads of a Sequence)."""

    token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    prefix_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    needs_prompt_logits: bool = False

    def __len__(self) -> int:
        return len(self.token_ids)


class DraftProposer:
    """Runs a second model with its own paged KV cache; k batched single-token steps per engine step."""

    def __init__(
        self, config: SpeculativeConfig, engine_config: EngineConfig, vocab_size: int, max_model_len: int
    ):
        from llmopt.checkpoints import resolve_model
        from llmopt.engine.model_runner import ModelRunner

        draft_config = replace(engine_config, model=config.model)
        q4_0 = config.draft_weights == "q4_0"
        self.runner = ModelRunner(draft_config, resolve_model(config.model), max_model_len, q4_0)
        draft_vocab = self.runner.model.config.vocab_size
        if draft_vocab != vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_vocab}) differs from the target's ({vocab_size})"
            )
        # Its own prefix cache: an agent's next turn replays the history, which the draft would otherwise
        # prefill whole before its first proposal (~2.5 ms a token for the 0.5B drafting for the 1.5B).
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks,
            engine_config.block_size,
            engine_config.enable_prefix_caching,
            inflight_prefix_sharing=False,
        )
        self.states: dict[str, DraftState] = {}
        # The last call's seconds per one-token step (None: it had none): what a position costs, apart
        # from catching up the tokens a sequence gained since it last proposed (a prefill of them).
        self.step_seconds: float | None = None
        # Seconds per token of a catch-up prefill, smoothed over the calls that had one (None: none yet).
        self.catch_up_seconds: float | None = None

    def state(self, seq: Sequence) -> DraftState:
        """`seq`'s place in the draft's cache; a sequence new to the draft takes its cached prefix."""
        state = self.states.get(seq.request_id)
        if state is None:
            state = self.states[seq.request_id] = DraftState(token_ids=list(seq.token_ids))
            self.block_manager.take_cached_prefix(state)
        return state

    def behind(self, seq: Sequence) -> int:
        """The tokens of `seq` the draft has to prefill before its first proposal, past the one a
        one-token step computes."""
        return max(0, len(seq) - 1 - self.state(seq).num_computed_tokens)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        bm = self.block_manager
        active: list[tuple[int, DraftState]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            state = self.state(seq)
            state.token_ids = list(seq.token_ids)
            # The KV past the verified tokens held rejected proposals; the blocks before it are final.
            state.num_computed_tokens = min(state.num_computed_tokens, len(seq) - 1)
            bm.cache_full_blocks(state)
            if bm.allocate(state, len(seq) + k):
                active.append((i, state))
        one_token_steps: list[float] = []
        catch_ups: list[float] = []
        tokens: dict[int, list[int]] = {i: [] for i, _ in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in active}
        for step in range(max((ks[i] for i, _ in active), default=0)):
            running = [(i, s) for i, s in active if step < ks[i]]
            batch = ScheduledBatch(
                [s for _, s in running], [len(s.token_ids) - s.num_computed_tokens for _, s in running]
            )
            start = time.perf_counter()
            logits = self.runner.run(batch, [1] * len(running))
            seconds = time.perf_counter() - start
            if max(batch.num_new_tokens) <= CAUGHT_UP:
                one_token_steps.append(seconds)
            else:
                catch_ups.append(seconds / sum(batch.num_new_tokens))
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
        for seconds in catch_ups:
            self.catch_up_seconds = smoothed(self.catch_up_seconds, seconds)
        proposals = [Proposal([]) for _ in seqs]
        for i, _ in active:
            proposals[i] = Proposal(tokens[i], torch.stack(probs[i]) if probs[i] else None)
        return proposals

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.block_manager.free(state)
