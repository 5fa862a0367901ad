"""The engine's speculation: before a step, each decoding sequence's proposals (forced by its grammar,
or from the proposer); after it, their verification against the target's rows, the counters of what was
accepted and the pacing that follows from them (policy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.draft import CAUGHT_UP, DraftProposer
from llmopt.engine.spec_decode.forced import propose_forced
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.policy import (
    PRIOR_POSITIONS,
    RAISE_PER_REQUEST_TURNED_DOWN,
    ForcedAcceptance,
    Offer,
    ProposalAcceptance,
    RequestAcceptance,
    acceptance_rate,
    catch_up_pays,
    forced_offer,
    plan,
    proposal_room,
    proposer_offer,
    record_acceptance,
    settle,
)
from llmopt.engine.spec_decode.stats import SpecStats
from llmopt.engine.spec_decode.step_cost import StepCost
from llmopt.engine.spec_decode.verify import verify

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig


def make_proposer(
    config: SpeculativeConfig, engine_config: EngineConfig, vocab_size: int, max_model_len: int
) -> NgramProposer | DraftProposer:
    if config.method == "ngram":
        return NgramProposer(config)
    return DraftProposer(config, engine_config, vocab_size, max_model_len)


class Speculator:
    """Owns the proposer (None without a speculative config: grammars still force proposals), the
    measured step costs, the engine-wide acceptance of forced and of proposed tokens and the SpecStats
    counters."""

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
        self.cost = StepCost()
        self.forced_acceptance = ForcedAcceptance()
        self.proposal_acceptance = ProposalAcceptance()
        self.request_acceptance = RequestAcceptance()  # of a draft model's requests
        self.requests_not_drafted = 0  # since the last request a draft model drafted for

    def wanted(self, running: list[Sequence]) -> bool:
        """Whether any of the `running` sequences may be given proposals this step."""
        return self.proposer is not None or any(s.grammar is not None for s in running)

    def propose(self, running: list[Sequence]) -> None:
        """Give every decoding sequence its proposals to verify in this step: the tokens its grammar
        forces (n-gram lookups may continue past them), or else up to k from the proposer, cut where
        the grammar refuses one; then cut all of them to the positions expected to pay at this step's
        measured cost (policy.plan). A draft model proposes only the positions the plan took."""
        k = self.config.num_speculative_tokens if self.config else 0
        ngram = self.proposer if isinstance(self.proposer, NgramProposer) else None
        decoding = [s for s in running if s.num_computed_tokens == len(s) - 1]
        offers: list[Offer] = []
        asked, rooms = [], []
        for seq in decoding:
            if propose_forced(seq, self.max_model_len, ngram, k):
                offers.append(forced_offer(seq, self.forced_acceptance))
            elif self.proposes_for(seq) and (room := proposal_room(seq, k, self.max_model_len)) > 0:
                if ngram is None and not self._catch_up_pays(seq, room):
                    seq.spec_skip = seq.params.max_tokens  # fewer tokens remain at every later step
                    self._stop_drafting(seq)
                    continue
                asked.append(seq)
                rooms.append(room)
        if ngram is not None and asked:  # lookups cost nothing: the plan weighs the tokens they found
            for seq, proposal in zip(asked, ngram.propose(asked, rooms)):
                seq.spec_token_ids = self._allowed(seq, proposal.tokens)
            rooms = [len(s.spec_token_ids) for s in asked]
        drafted = ngram is None
        offers += [
            proposer_offer(seq, room, self.proposal_acceptance, drafted)
            for seq, room in zip(asked, rooms)
            if room
        ]
        if not offers:
            return
        plan(offers, len(decoding), self.cost)
        drafts = []
        for offer in offers:
            taken = settle(offer)
            if offer.drafted and taken:
                drafts.append((offer.seq, taken))
            elif offer.drafted:  # settle stopped its drafting for the rest of the request
                self._stop_drafting(offer.seq)
        if drafts:
            self._draft([seq for seq, _ in drafts], [taken for _, taken in drafts])

    def _catch_up_pays(self, seq: Sequence, positions: int) -> bool:
        """Whether the draft's prefill of what it is behind on `seq` (its prompt, before the first
        proposal) is earned back over the tokens `seq` may still write, at the latest drafted requests'
        acceptance, or at that raised by each request turned down since (a probe). Until both the draft's
        catch-up and its steps are measured, it drafts (and so measures them)."""
        assert isinstance(self.proposer, DraftProposer)
        behind = self.proposer.behind(seq)
        if behind <= CAUGHT_UP or self.proposer.catch_up_seconds is None or not self.cost.measured:
            return True
        remaining = seq.params.max_tokens - seq.num_output_tokens
        catch_up = behind * self.proposer.catch_up_seconds
        rate = self.request_acceptance.rate
        if rate is None:
            rate = acceptance_rate(seq, self.proposal_acceptance)
        if catch_up_pays(rate, positions, remaining, catch_up, self.cost):
            self.requests_not_drafted = 0
            return True
        raised = min(1.0, rate + RAISE_PER_REQUEST_TURNED_DOWN * self.requests_not_drafted)
        if raised > rate and catch_up_pays(raised, positions, remaining, catch_up, self.cost):
            # A probe: it starts as if its first positions had been accepted, so that the plan verifies
            # some instead of stopping at the engine's rate.
            self.requests_not_drafted = 0
            seq.spec_passed = seq.spec_tested = PRIOR_POSITIONS
            return True
        self.requests_not_drafted += 1
        return False

    def proposes_for(self, seq: Sequence) -> bool:
        return self.proposer is not None and not (self.config.greedy_only and not seq.params.greedy)

    def _draft(self, seqs: list[Sequence], ks: list[int]) -> None:
        """The draft model's proposals for `seqs`, `ks` deep, and what their drafting cost."""
        assert self.proposer is not None, "only a proposer drafts"
        proposals = self.proposer.propose(seqs, ks)
        if isinstance(self.proposer, DraftProposer) and self.proposer.step_seconds is not None:
            self.cost.record_draft(self.proposer.step_seconds)
        for seq, proposal in zip(seqs, proposals):
            tokens = self._allowed(seq, proposal.tokens)
            probs = proposal.draft_probs
            probs = probs[: len(tokens)] if probs is not None and tokens else None
            seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = tokens, probs, 0

    @staticmethod
    def _allowed(seq: Sequence, tokens: list[int]) -> list[int]:
        """`tokens` cut where `seq`'s grammar refuses one."""
        return tokens[: seq.grammar.valid_prefix(tokens)] if seq.grammar is not None else tokens

    def record_step(self, seqs: list[Sequence], num_new_tokens: list[int], seconds: float) -> None:
        """A step's forward took `seconds`: a decoding step's (every sequence one row and one a
        proposal, no prompt rows) joins the measured costs."""
        if all(
            s.num_computed_tokens == len(s) - 1 and n == 1 + len(s.spec_token_ids)
            for s, n in zip(seqs, num_new_tokens)
        ):
            self.cost.record_step(sum(num_new_tokens), seconds)

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
            record_acceptance(seq, len(seq.spec_token_ids), accepted)
            self.proposal_acceptance.record(len(seq.spec_token_ids), accepted)
        # KV is valid up to the last accepted proposal; the rejected slots are overwritten later.
        seq.num_computed_tokens += 1 + accepted
        seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = [], None, 0
        return new_tokens

    def _stop_drafting(self, seq: Sequence) -> None:
        """The draft model drafts no more for `seq`: its acceptance, if it drafted, joins the requests'
        and its KV blocks are freed."""
        assert isinstance(self.proposer, DraftProposer)
        if seq.request_id in self.proposer.states:
            self.request_acceptance.record(seq)
            self.proposer.release(seq.request_id)

    def release(self, seq: Sequence) -> None:
        """Forget a finished request (a draft model's KV blocks are freed)."""
        if isinstance(self.proposer, DraftProposer):
            self._stop_drafting(seq)
