"""How much to propose, per sequence and step. Verifying k proposals costs k more rows in every layer's
GEMMs (on this CPU about as much as the tokens it may save), so a sequence proposes about one more token
than it has recently been accepting; after a step with nothing accepted it pauses (1, 2, 4 ... steps),
and while it accepts fewer than one token per proposal on average it only probes every few steps.
None of this changes outputs: it only decides what is verified."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmopt.engine.sequence import Sequence

MAX_SPEC_BACKOFF = 16  # steps without proposals after repeated rejections
SPEC_PROBE_INTERVAL = 4  # steps between proposals while fewer than one token per proposal is accepted
MAX_FORCED_POSITIONS = 16  # forced proposals tracked per position (more than a verification takes)


def proposal_room(seq: Sequence, k: int, max_model_len: int) -> int:
    """How many tokens to propose for `seq` this step (0: none). Counts down a pause as it goes."""
    if seq.spec_skip > 0:
        seq.spec_skip -= 1
        return 0
    if seq.num_computed_tokens != len(seq) - 1:  # still prefilling
        return 0
    recent = k if seq.spec_accepted_ema is None else math.ceil(seq.spec_accepted_ema) + 1
    return max(
        0,
        min(k, recent, seq.params.max_tokens - seq.num_output_tokens - 1, max_model_len - len(seq) - 1),
    )


def record_acceptance(seq: Sequence, accepted: int) -> None:
    """Update `seq`'s recent acceptance and its pause after a verification that accepted `accepted`."""
    ema = seq.spec_accepted_ema
    seq.spec_accepted_ema = accepted if ema is None else 0.7 * ema + 0.3 * accepted
    seq.spec_backoff = 0 if accepted else min(2 * seq.spec_backoff or 1, MAX_SPEC_BACKOFF)
    seq.spec_skip = max(seq.spec_backoff, SPEC_PROBE_INTERVAL if seq.spec_accepted_ema < 1 else 0)


# A decode step's fixed cost, in rows: streaming the weights once costs what this many rows of arithmetic
# cost. On the AVX2 2-core machine a 1-row step takes 18 ms and a 16-row one 75.6 ms (README), so a row
# costs 3.8 ms and the rest 14.2 ms.
FIXED_COST_ROWS = 3.7
FORCED_PRIOR = 4  # proposals counted as accepted at every position before any is verified


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


def trim_forced(seqs: list[Sequence], acceptance: ForcedAcceptance) -> None:
    """Cut the forced proposals of a step's decoding `seqs` to those expected to pay. A proposal adds a
    row to every layer's arithmetic and is expected to add `acceptance.rate(position)` tokens; it pays
    while that beats what a row of the step yields, tokens over (fixed cost + rows). At batch 1 a row
    yields about a quarter of a token, so every forced token pays; at batch 8 a row already yields about
    0.7, and only the first two or three positions (accepted 80-90 % of the time) do. Positions are taken
    first to last across the sequences; n-gram proposals past a cut are cut with it."""
    rows = tokens = float(len(seqs))
    rows += sum(len(s.spec_token_ids) for s in seqs if not s.spec_num_forced)
    keep = dict.fromkeys((id(s) for s in seqs if s.spec_num_forced), 0)
    for position in range(MAX_FORCED_POSITIONS):
        rate = acceptance.rate(position)
        for seq in seqs:
            if keep.get(id(seq)) != position or position >= seq.spec_num_forced:
                continue
            if rate <= tokens / (FIXED_COST_ROWS + rows):
                break
            keep[id(seq)], rows, tokens = position + 1, rows + 1, tokens + rate
    for seq in seqs:
        if id(seq) not in keep:
            continue
        kept = keep[id(seq)] if keep[id(seq)] < seq.spec_num_forced else len(seq.spec_token_ids)
        del seq.spec_token_ids[kept:]
        seq.spec_num_forced = min(seq.spec_num_forced, kept)
