"""What speculation costs, measured as the engine runs: a decoding step's forward seconds by its row count
(one row a decoding sequence plus one a proposal) and a proposer's seconds per proposed position (a draft
model's batched one-token step; n-gram lookups cost nothing). The policy weighs a proposal's
expected tokens against these, so the same rule holds on a memory-bound one-row step (where rows are
nearly free) and on an arithmetic-bound one (where each row costs what it may save)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Before a row count is measured: a step costs (PRIOR_FIXED_ROWS + rows) units, i.e. streaming the weights
# once costs what this many rows of arithmetic cost. Measured on the AVX2 2-core machine (1 row 18 ms, 16
# rows 75.6 ms); on Qwen2.5-Coder-1.5B here 1 row 37 ms and 5 rows ~70 ms give about 3.5.
PRIOR_FIXED_ROWS = 3.7
MAX_MEASURED_ROWS = 64  # steps with more rows (prefill chunks) are not decode steps
SMOOTHING = 0.2  # weight of a new measurement in the pace: a VM's speed drifts over minutes, not steps
# ... and in a row count's own cost: how a step's cost grows with its rows is the kernels' and the model's,
# which change slowly if at all, so a drift is taken up by the pace (that every row count follows).
SHAPE_SMOOTHING = 0.05


def smoothed(old: float | None, new: float, weight: float = SMOOTHING) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class StepCost:
    """Seconds at pace 1, and the pace the machine runs at now against them."""

    seconds_by_rows: dict[int, float] = field(default_factory=dict)
    draft_seconds: float = 0.0  # per proposed position; 0 until a proposer is measured
    # Every measurement of a known kind moves the pace by its ratio to what it was expected to take, so
    # the costs of every row count follow the VM's drift, those the plan no longer takes too. Kept apart,
    # they did not: the 1.5B's 2-row cost from a slow minute (50 ms) against 1-row steps measured since
    # (29 ms) made the 0.5B draft look like a loss, and since no 2-row step ran again, the engine never
    # drafted again (code at one stream, 6 requests of 12).
    pace: float = 1.0

    def record_step(self, rows: int, seconds: float) -> None:
        """A decoding step (no prompt rows) of `rows` rows took `seconds` in its forward."""
        if 0 < rows <= MAX_MEASURED_ROWS:
            known = self.seconds_by_rows.get(rows)
            self.keep_pace(known, seconds)
            self.seconds_by_rows[rows] = smoothed(known, seconds / self.pace, SHAPE_SMOOTHING)

    def record_draft(self, seconds: float) -> None:
        """A draft model's one-token step took `seconds`."""
        known = self.draft_seconds or None
        self.keep_pace(known, seconds)
        self.draft_seconds = smoothed(known, seconds / self.pace, SHAPE_SMOOTHING)

    def keep_pace(self, known: float | None, seconds: float) -> None:
        if known is not None:
            self.pace = smoothed(self.pace, seconds / known)

    def seconds(self, rows: int) -> float:
        """A step of `rows` rows at the current pace: measured, else interpolated between the nearest
        measured row counts, else extrapolated along the measured counts' least-squares line (scaled from
        the one measured count by the prior while there is only one; in the prior's units while there is
        none)."""
        return self.pace * self.seconds_at_pace_1(rows)

    def seconds_at_pace_1(self, rows: int) -> float:
        known = self.seconds_by_rows
        if rows in known:
            return known[rows]
        below = max((r for r in known if r < rows), default=None)
        above = min((r for r in known if r > rows), default=None)
        if below is not None and above is not None:
            t = (rows - below) / (above - below)
            return known[below] + t * (known[above] - known[below])
        nearest = below if below is not None else above
        if nearest is None:
            return PRIOR_FIXED_ROWS + rows
        if len(known) == 1:
            return known[nearest] * (PRIOR_FIXED_ROWS + rows) / (PRIOR_FIXED_ROWS + nearest)
        mean_rows = sum(known) / len(known)
        mean_seconds = sum(known.values()) / len(known)
        spread = sum((r - mean_rows) ** 2 for r in known)
        slope = max(0.0, sum((r - mean_rows) * (t - mean_seconds) for r, t in known.items()) / spread)
        return max(known[nearest] + slope * (rows - nearest), 1e-6)

    @property
    def measured(self) -> bool:
        """Whether both a decoding step and a draft step have been measured (costs are in seconds)."""
        return bool(self.seconds_by_rows) and self.draft_seconds > 0

    def proposing(self, rows: int, depth: int) -> float:
        """A step of `rows` rows whose proposals were drafted `depth` positions deep."""
        draft = self.draft_seconds if self.seconds_by_rows else 0.0  # seconds weigh nothing in prior units
        return self.seconds(rows) + self.pace * draft * depth
