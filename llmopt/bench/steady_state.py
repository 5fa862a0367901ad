"""A point's steady state: its latency and throughput figures without its warm-up and drain.

A point starts on an idle server (a closed loop sends its first wave at once) and ends draining (the
last requests run beside ever fewer others), so its edges measure another load than its middle. Per run
of the point, when the run has at least STEADY_MIN_REQUESTS successful requests:
- latency distributions (TTFT, TPOT, ITL, E2E) are over the requests sent in the middle of the run's send
  window: those sent in its first and last STEADY_EDGE (10 %) are left out;
- throughputs are over the requests that finished in the middle of the run's finish window (its first and
  last 10 % left out), as a rate from the first of those finishes to the last: counted by finish, not by
  send, so that a point whose queue grows gets the rate the server completed, not the one it was asked.
A smaller run counts whole, over its wall time, and so does one whose middle holds no send. Request
counts, token totals, goodput and SLO attainment always count every request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmopt.bench.client import RequestRecord

STEADY_MIN_REQUESTS = 20
STEADY_EDGE = 0.10
RULE = (
    f"runs of at least {STEADY_MIN_REQUESTS} successful requests: latency over those sent in the middle "
    f"{1 - 2 * STEADY_EDGE:.0%} of the send window, throughput over those finished in the middle "
    f"{1 - 2 * STEADY_EDGE:.0%} of the finish window (first to last finish); smaller runs whole"
)


@dataclass
class SteadyState:
    """What a point's latency and throughput figures are computed over."""

    latency: list[RequestRecord]  # successful requests whose latencies count
    finished: list[RequestRecord]  # successful requests whose tokens count toward throughput
    span_s: float  # the time those finished over (a run counted whole: its wall time)
    of: int  # successful requests in all
    applied: bool  # whether any run was cut

    def block(self) -> dict:
        """The summary's `steady_state`."""
        return {
            "rule": RULE,
            "applied": self.applied,
            "kept": len(self.latency),
            "of": self.of,
            "throughput_requests": len(self.finished),
            "throughput_span_s": self.span_s,
        }


def end(record: RequestRecord) -> float:
    return record.start + (record.e2e or 0.0)


def middle(records: list[RequestRecord], time: Callable[[RequestRecord], float]) -> list[RequestRecord]:
    """The records whose `time` is not in the first or last STEADY_EDGE of their span."""
    low, high = min(map(time, records)), max(map(time, records))
    cut = STEADY_EDGE * (high - low)
    return [r for r in records if low + cut <= time(r) <= high - cut]


def run_steady_state(records: list[RequestRecord], wall_s: float) -> SteadyState:
    """One run's steady state (the whole run when it is too small or finished all at once)."""
    ok = [r for r in records if r.success]
    whole = SteadyState(ok, ok, wall_s, len(ok), False)
    if len(ok) < STEADY_MIN_REQUESTS:
        return whole
    finishing, latency = middle(ok, end), middle(ok, lambda r: r.start)
    # Sends or finishes in two waves at the window's edges (24 requests at 16 in flight) leave no middle.
    if not finishing or not latency:
        return whole
    first, last = min(map(end, finishing)), max(map(end, finishing))
    if last <= first:
        return whole
    # Those at the first finish open the span: counting them too would count one more than its length holds.
    counted = [r for r in finishing if end(r) > first]
    return SteadyState(latency, counted, last - first, len(ok), True)


def steady_state(runs: list[tuple[list[RequestRecord], float]]) -> SteadyState:
    """The steady state of a point of one or more runs ((records, wall time) each): each run's, pooled."""
    parts = [run_steady_state(records, wall) for records, wall in runs]
    return SteadyState(
        [r for p in parts for r in p.latency],
        [r for p in parts for r in p.finished],
        sum(p.span_s for p in parts),
        sum(p.of for p in parts),
        any(p.applied for p in parts),
    )
