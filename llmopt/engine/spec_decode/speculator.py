"""The engine's speculation: before a step, each decoding sequence's proposals (forced by its grammar,
or from the proposer); after it, their verification against the target's rows, the counters of what was
accepted and the pacing that follows from them (policy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode import make_proposer
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.draft import DraftProposer
from llmopt.engine.spec_decode.forced import propose_forced
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.policy import ForcedAcceptance, proposal_room, record_acceptance, trim_forced
from llmopt.engine.spec_decode.stats import SpecStats
from llmopt.engine.spec_decode.verify import verify

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig


class Speculator:
    """Owns the proposer (None without a speculative config: grammars still force proposals), the
    engine-wide acceptance of forced proposals and the SpecStats counters."""

    def __init__(
        self,
        config: SpeculativeConfig | None,
        engine_config: EngineConfig,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: set[int],
    ):
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.proposer: NgramProposer | DraftProposer | None = (
            make_proposer(config, engine_config, vocab_size, max_model_len) if config else None
        )
        self.stats = SpecStats()
        self.forced_acceptance = ForcedAcceptance()

    def wanted(self, running: list[Sequence]) -> bool:
        """Whether any of the `running` sequences may be given proposals this step."""
        return self.proposer is not None or any(s.grammar is not None for s in running)

    def propose(self, running: list[Sequence]) -> None:
        """Give every decoding sequence its proposals to verify in this step: the tokens its grammar
        forces (n-gram lookups may continue past them), or else up to k from the proposer, cut where
        the grammar refuses one. Forced proposals are then cut to those expected to pay at this batch
        size (policy.trim_forced)."""
        k = self.config.num_speculative_tokens if self.config else 0
        ngram = self.proposer if isinstance(self.proposer, NgramProposer) else None
        ready, ks, forced = [], [], False
        for seq in running:
            if propose_forced(seq, self.max_model_len, ngram, k):
                forced = True
                continue
            room = proposal_room(seq, k, self.max_model_len) if self.proposer is not None else 0
            if room > 0:
                ready.append(seq)
                ks.append(room)
        if ready:
            assert self.proposer is not None, "only a proposer gives room to propose"
            for seq, proposal in zip(ready, self.proposer.propose(ready, ks)):
                tokens, probs = proposal.tokens, proposal.draft_probs
                if seq.grammar is not None:
                    tokens = tokens[: seq.grammar.valid_prefix(tokens)]
                    probs = probs[: len(tokens)] if probs is not None and tokens else None
                seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = tokens, probs, 0
        if forced:
            decoding = [s for s in running if s.num_computed_tokens == len(s) - 1]
            trim_forced(decoding, self.forced_acceptance)

    def verify(self, seq: Sequence, logits: torch.Tensor, greedy: list[int] | None) -> list[int]:
        """The tokens `seq` gains from verifying its proposals against its `logits` rows (one per
        proposal and one past them): the accepted proposals and a corrected or bonus token."""
        assert seq.spec_token_ids, "only a sequence with proposals is verified"
        new_tokens, accepted = verify(
            logits, seq.spec_token_ids, seq.spec_draft_probs, seq, self.eos_token_ids, greedy=greedy
        )
        forced = min(seq.spec_num_forced, len(seq.spec_token_ids))
        self.stats.record(len(seq.spec_token_ids), accepted, forced)
        if forced:  # forced tokens are paced by their acceptance at each position, engine-wide
            self.forced_acceptance.record(forced, accepted)
        else:
            record_acceptance(seq, accepted)
        # KV is valid up to the last accepted proposal; the rejected slots are overwritten later.
        seq.num_computed_tokens += 1 + accepted
        seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = [], None, 0
        return new_tokens

    def release(self, request_id: str) -> None:
        """Forget a finished request (a draft model's KV blocks are freed)."""
        if self.proposer is not None:
            self.proposer.release(request_id)
