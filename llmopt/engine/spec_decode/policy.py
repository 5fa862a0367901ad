"""How much to propose, per sequence and step. Verifying k proposals costs k more rows in every layer's
GEMMs (on this CPU about as much as the tokens it may save), so a sequence proposes about one more token
than it has recently been accepting; after a step with nothing accepted it pauses (1, 2, 4 ... steps),
and while it accepts fewer than one token per proposal on average it only probes every few steps.
None of this changes outputs: it only decides what is verified."""

from __future__ import annotations

import math

from llmopt.engine.sequence import Sequence

MAX_SPEC_BACKOFF = 16  # steps without proposals after repeated rejections
SPEC_PROBE_INTERVAL = 4  # steps between proposals while fewer than one token per proposal is accepted


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
