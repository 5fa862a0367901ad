"""How much to propose, per sequence and step, from what the engine has measured: each step's cost by its
rows and the draft's cost per position (step_cost.py), and how often each sequence's proposals are
accepted. A proposal at position i (0: the first) is worth the chance that it and all before it are
accepted; it costs one more row in the step and, as the deepest one, one more draft step. Positions are
taken, first to last across the sequences, while they raise the step's expected tokens per second. So a
memory-bound step at batch 1 takes several, an arithmetic-bound batch of 8 only the likeliest, and text
whose proposals fail takes none: its sequence then probes one n-gram position now and then (ever more
rarely while probes fail, and only in steps whose rows are cheap) to notice when its text turns
repetitive, or stops drafting for the rest of the request. None of this changes outputs: it only decides
what is verified."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.step_cost import StepCost

# Steps before a sequence whose lookups do not pay probes one position, doubling after each probe that
# fails. At batch 1 on Qwen2.5-Coder-1.5B a failed probe costs a row, 2-8 ms of a 35 ms step, so 16 steps
# and then more keep a stream whose lookups always fail above 0.99x of no speculation.
PROBE_INTERVAL = 16
MAX_PROBE_INTERVAL = 256
# A due probe is verified only where a proposal accepted this often would pay for its row: at one and two
# rows, not at four and more, where a row costs about what a sure proposal saves and the plan takes only
# near-certain ones (the 1.5B here, benchmarks/step_rows.py: 49.4 ms at 4 rows, 61.6 at 5; probes there cost
# code answers at 4 streams ~2 %).
PROBE_RATE = 0.5
ACCEPTANCE_MEMORY = 0.8  # weight of a sequence's past verifications against its latest
# ... and of the engine's (about the last 50 verifications, a 160-token answer's): the text a server is
# sent changes, and the prior of a new request should be what proposals do on the latest, not all since
# the start (the 0.5B drafting for the 1.5B: 93 % on code, 49-65 % on chat).
ENGINE_MEMORY = 0.98
# Each request a draft model was turned down for since it last drafted raises the acceptance the next one is
# judged at by this much: only a request's own verifications move the rate, so without it a draft turned down
# by the text it failed on (chat) would never draft again for text it pays on (code: 1.00x there after chat,
# where drafting from the start ran 1.26x; benchmarks/draft_model.py). From chat's 30-50 % a 160-token code
# answer, which pays from ~60 %, drafts after 1-3 turned down; a 64-token chat answer after code, which needs
# ~80 %, is retried every 3-5 (each retry costs it ~10 %). At 0.05 a step, 3 code tasks after chat never
# drafted (benchmarks/real_model.py).
RAISE_PER_REQUEST_TURNED_DOWN = 0.1
# A draft's catch-up is a bet on a request's acceptance before any of its tokens is verified, while requests
# run from 29-65 % (chat) to 90-93 % (code) for the 0.5B drafting for the 1.5B: it is taken only where it
# pays twice over, at the acceptance of the latest requests drafted for (RequestAcceptance). Taken where it
# paid once, chat answers of 64 tokens to 128-token prompts after code drafted and ran 0.93x (0.89-0.97,
# benchmarks/draft_model.py); a 160-token code answer to a 50-token task saves ~10x its catch-up (~0.1 s).
CATCH_UP_MARGIN = 2.0
PRIOR_POSITIONS = 2.0  # the engine-wide acceptance counts as this many positions of a new sequence's
MAX_FORCED_POSITIONS = 16  # forced proposals tracked per position (more than a verification takes)
FORCED_PRIOR = 4  # proposals counted as accepted at every position before any is verified


def proposal_room(seq: Sequence, k: int, max_model_len: int) -> int:
    """How many tokens `seq` may be offered this step (0: none): at most k, what its max_tokens and the
    model's length leave, none while prefilling or pausing. Counts a pause down as it goes."""
    if seq.num_computed_tokens != len(seq) - 1:  # still prefilling
        return 0
    if seq.spec_skip > 0:
        seq.spec_skip -= 1
        return 0
    return max(0, min(k, seq.params.max_tokens - seq.num_output_tokens - 1, max_model_len - len(seq) - 1))


@dataclass
class ProposalAcceptance:
    """Engine-wide: how often a proposer's proposal is accepted given all before it were (the prior of a
    sequence that has not been verified yet), over the latest verifications. Starts at one half."""

    passed: float = 1.0
    tested: float = 2.0

    def record(self, proposed: int, accepted: int) -> None:
        self.passed = ENGINE_MEMORY * self.passed + accepted
        self.tested = ENGINE_MEMORY * self.tested + accepted + (accepted < proposed)

    def rate(self) -> float:
        return self.passed / self.tested


# Weight of the requests drafted for before the latest in RequestAcceptance: one request that fails moves
# the next one's bet halfway. Judged per verification instead, a code phase's ~37 verifications a request
# outweighed the 3-5 of a chat request that stopped drafting, and every chat request after code drafted
# (0.91x, its catch-up ~10 % of a 64-token answer; benchmarks/draft_model.py).
REQUEST_MEMORY = 0.5


@dataclass
class RequestAcceptance:
    """Engine-wide: how often the proposals of the latest requests a draft model drafted for were
    accepted, each request one vote whatever its length (None: none drafted yet)."""

    rate: float | None = None

    def record(self, seq: Sequence) -> None:
        """`seq` stopped drafting (or ended): its acceptance over all its verifications joins the rate."""
        if seq.spec_tested_total:
            own = seq.spec_passed_total / seq.spec_tested_total
            self.rate = own if self.rate is None else REQUEST_MEMORY * self.rate + (1 - REQUEST_MEMORY) * own


def acceptance_rate(seq: Sequence, engine: ProposalAcceptance) -> float:
    """`seq`'s chance that a proposal is accepted when all before it were, its recent verifications
    weighed against the engine-wide rate."""
    return (seq.spec_passed + PRIOR_POSITIONS * engine.rate()) / (seq.spec_tested + PRIOR_POSITIONS)


def record_acceptance(seq: Sequence, proposed: int, accepted: int) -> None:
    """After a verification of `proposed` proposals with the first `accepted` accepted: the positions
    tested (each accepted one and the first rejected) join `seq`'s recent acceptance."""
    tested = accepted + (accepted < proposed)
    seq.spec_passed = ACCEPTANCE_MEMORY * seq.spec_passed + accepted
    seq.spec_tested = ACCEPTANCE_MEMORY * seq.spec_tested + tested
    seq.spec_passed_total += accepted
    seq.spec_tested_total += tested


@dataclass
class Offer:
    """Positions a sequence could verify this step, each with its chance of being accepted (falling)."""

    seq: Sequence
    rates: list[float]
    drafted: bool = False  # each position deeper than the others' costs a draft model's step
    forced: bool = False
    probe: bool = False  # its sequence's probe is due
    taken: int = 0  # positions the plan takes
    probed: int = 0  # of those, the probe's


def forced_offer(seq: Sequence, acceptance: ForcedAcceptance) -> Offer:
    """`seq`'s forced proposals, each position at its engine-wide rate."""
    positions = min(seq.spec_num_forced, MAX_FORCED_POSITIONS)
    return Offer(seq, [acceptance.rate(i) for i in range(positions)], forced=True)


def proposer_offer(seq: Sequence, positions: int, engine: ProposalAcceptance, drafted: bool) -> Offer:
    """Up to `positions` proposals for `seq`, each accepted with its rate after the one before."""
    rate = acceptance_rate(seq, engine)
    rates = [rate ** (i + 1) for i in range(positions)]
    return Offer(seq, rates, drafted=drafted, probe=seq.spec_probe_due and positions > 0)


def catch_up_pays(
    rate: float, positions: int, remaining: int, catch_up_seconds: float, cost: StepCost
) -> bool:
    """Whether drafting for a sequence saves CATCH_UP_MARGIN times what the draft's prefill of the tokens
    it is behind costs (`catch_up_seconds`), over its `remaining` tokens: seconds a token at one row,
    drafting at the best depth up to `positions` against not drafting."""
    plain = cost.proposing(1, 0)
    best = plain
    for depth in range(1, positions + 1):
        tokens = 1 + sum(rate ** (i + 1) for i in range(depth))
        best = min(best, cost.proposing(1 + depth, depth) / tokens)
    return (plain - best) * remaining > CATCH_UP_MARGIN * catch_up_seconds


def plan(offers: list[Offer], decoding_rows: int, cost: StepCost) -> None:
    """Set each offer's `taken`: a due probe's first position where one accepted at PROBE_RATE would
    pay, then positions first to last across the offers, likeliest first, while each raises the step's
    expected tokens per second (`decoding_rows` rows and tokens before any)."""
    rows, tokens, depth = decoding_rows, float(decoding_rows), 0
    for offer in (o for o in offers if o.probe):
        new_depth = max(depth, 1) if offer.drafted else depth
        if pays(PROBE_RATE, rows, tokens, depth, new_depth, cost):
            offer.taken = offer.probed = 1
            rows, tokens, depth = rows + 1, tokens + offer.rates[0], new_depth
    for position in range(max((len(o.rates) for o in offers), default=0)):
        here = [o for o in offers if o.taken == position < len(o.rates)]
        for offer in sorted(here, key=lambda o: -o.rates[position]):
            new_depth = max(depth, position + 1) if offer.drafted else depth
            gain = offer.rates[position]
            if not pays(gain, rows, tokens, depth, new_depth, cost):
                break
            offer.taken, rows, tokens, depth = position + 1, rows + 1, tokens + gain, new_depth


def pays(gain: float, rows: int, tokens: float, depth: int, new_depth: int, cost: StepCost) -> bool:
    """Whether one more row, expected to add `gain` tokens (and to deepen the draft to `new_depth`),
    raises the expected tokens per second of a step of `rows` rows and `tokens` tokens."""
    return (tokens + gain) * cost.proposing(rows, depth) > tokens * cost.proposing(rows + 1, new_depth)


def settle(offer: Offer) -> int:
    """Cut the sequence's proposals to what the plan took and pace it: a proposer's sequence whose offer
    took nothing pauses, each pause twice the last until one pays, and probes when the pause ends.
    Returns the positions taken (a draft model proposes that many)."""
    seq = offer.seq
    if offer.forced:  # n-gram tokens past the forced ones ride along only if every forced one is kept
        kept = offer.taken if offer.taken < seq.spec_num_forced else len(seq.spec_token_ids)
        del seq.spec_token_ids[kept:]
        seq.spec_num_forced = min(seq.spec_num_forced, kept)
        return kept
    del seq.spec_token_ids[offer.taken :]
    seq.spec_probe_due = False
    if offer.taken == 0 and offer.drafted:
        # Resuming would first cost the draft a prefill of every token since (measured: ~7 % of the
        # paused steps' time for the 0.5B drafting for the 1.5B, whatever the pause): it stops for good.
        seq.spec_skip = seq.params.max_tokens
    elif offer.taken == 0:
        seq.spec_skip, seq.spec_probe_due = seq.spec_probe_interval or PROBE_INTERVAL, True
        seq.spec_probe_interval = min(2 * seq.spec_skip, MAX_PROBE_INTERVAL)
    elif offer.taken > offer.probed:  # the plan itself took a position: proposals pay again
        seq.spec_probe_interval = 0
    return offer.taken


@dataclass
class ForcedAcceptance:
    """How often a forced proposal at each position (0: the first) is accepted. Most are, but not all:
    the model may write the forced text in other tokens than xgrammar's, and each rejection costs the
    rows after it."""

    proposed_at: list[int] = field(default_factory=lambda: [0] * MAX_FORCED_POSITIONS)
    accepted_at: list[int] = field(default_factory=lambda: [0] * MAX_FORCED_POSITIONS)

    def record(self, forced: int, accepted: int) -> None:
        for i in range(min(forced, MAX_FORCED_POSITIONS)):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < accepted

    def rate(self, position: int) -> float:
        return (self.accepted_at[position] + FORCED_PRIOR) / (self.proposed_at[position] + FORCED_PRIOR)
