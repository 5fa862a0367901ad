"""A point's steady state: its latency and throughput figures without its warm-up and drain.

A point starts on an idle server (a closed loop sends its first wave at once) and ends draining (the
last requests run beside ever fewer others), so its edges measure another load than its middle. Per run
of the point, when the run has at least STEADY_MIN_REQUESTS successful requests:
- latency distributions (TTFT, TPOT, ITL, E2E) are over the requests sent in the middle of the run's send
  window: those sent in its first and last STEADY_EDGE (10 %) are left out;
- throughputs are over the output that arrived in the middle of the run's arrival window (the first and
  last 10 % of the span from its first streamed chunk to its last left out), as a rate from the first of
  those chunks to the last, each request counted by the share of its output tokens among them: by
  arrival, not by send, so that a point whose queue grows gets the rate the server delivered, not the
  one it was asked. Not by finish: a closed loop's requests run in step and finish in waves, so a rate
  between the first and last finish of a window read 168,522 tok/s for a round whose wall-time rate was
  403 (32 requests of 128 tokens at 16 in flight); chunks keep coming between the waves.
A smaller run counts whole, over its wall time, and so does one whose middle holds no send. Request
counts, token totals, goodput and SLO attainment always count every request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmopt.bench.schema import RequestRecord

STEADY_MIN_REQUESTS = 20
STEADY_EDGE = 0.10
RULE = (
    f"runs of at least {STEADY_MIN_REQUESTS} successful requests: latency over those sent in the middle "
    f"{1 - 2 * STEADY_EDGE:.0%} of the send window, throughput over the output that arrived in the middle "
    f"{1 - 2 * STEADY_EDGE:.0%} of the arrival window (first to last chunk); smaller runs whole"
)


@dataclass
class SteadyState:
    """What a point's latency and throughput figures are computed over."""

    latency: list[RequestRecord]  # successful requests whose latencies count
    # successful requests with output in the window, each with the share of its output tokens there
    delivered: list[tuple[RequestRecord, float]]
    span_s: float  # the time that output arrived over (a run counted whole: its wall time)
    of: int  # successful requests in all
    applied: bool  # whether any run was cut

    def block(self) -> dict:
        """The summary's `steady_state`."""
        return {
            "rule": RULE,
            "applied": self.applied,
            "kept": len(self.latency),
            "of": self.of,
            "throughput_requests": round(sum(share for _, share in self.delivered), 3),
            "throughput_span_s": self.span_s,
        }


def chunk_times(record: RequestRecord) -> list[float]:
    """When each streamed chunk of `record` arrived (an answer sent whole: once, at its end)."""
    if record.ttft is None:
        return [record.start + (record.e2e or 0.0)]
    times = [record.start + record.ttft]
    for gap in record.itl:
        times.append(times[-1] + gap)
    return times


def middle_window(times: list[float]) -> tuple[float, float]:
    """The span of `times` without its first and last STEADY_EDGE."""
    low, high = min(times), max(times)
    cut = STEADY_EDGE * (high - low)
    return low + cut, high - cut


def middle(records: list[RequestRecord], time: Callable[[RequestRecord], float]) -> list[RequestRecord]:
    """The records whose `time` is not in the first or last STEADY_EDGE of their span."""
    low, high = middle_window([time(r) for r in records])
    return [r for r in records if low <= time(r) <= high]


def delivered_in_middle(records: list[RequestRecord]) -> tuple[list[tuple[RequestRecord, float]], float]:
    """Each record's share of the chunks that arrived in the middle of the arrival window, and the time
    from the first of those to the last ([], 0.0 where the middle holds no two distinct arrivals)."""
    chunks = {id(r): chunk_times(r) for r in records}
    low, high = middle_window([t for times in chunks.values() for t in times])
    inside = {id(r): [t for t in chunks[id(r)] if low <= t <= high] for r in records}
    times = [t for kept in inside.values() for t in kept]
    if not times:
        return [], 0.0
    first, last = min(times), max(times)
    # Those at the first arrival open the span: counting them too would count one more than its length holds.
    counts = {key: sum(t > first for t in kept) for key, kept in inside.items()}
    shares = [(r, counts[id(r)] / len(chunks[id(r)])) for r in records if counts[id(r)]]
    return shares, last - first


def run_steady_state(records: list[RequestRecord], wall_s: float) -> SteadyState:
    """One run's steady state (the whole run when it is too small or finished all at once)."""
    ok = [r for r in records if r.success]
    whole = SteadyState(ok, [(r, 1.0) for r in ok], wall_s, len(ok), False)
    if len(ok) < STEADY_MIN_REQUESTS:
        return whole
    latency = middle(ok, lambda r: r.start)
    delivered, span = delivered_in_middle(ok)
    # Sends in two waves at the window's edges (24 requests at 16 in flight) leave no middle.
    if not latency or span <= 0:
        return whole
    return SteadyState(latency, delivered, span, len(ok), True)


def steady_state(runs: list[tuple[list[RequestRecord], float]]) -> SteadyState:
    """The steady state of a point of one or more runs ((records, wall time) each): each run's, pooled."""
    parts = [run_steady_state(records, wall) for records, wall in runs]
    return SteadyState(
        [r for p in parts for r in p.latency],
        [d for p in parts for d in p.delivered],
        sum(p.span_s for p in parts),
        sum(p.of for p in parts),
        any(p.applied for p in parts),
    )
