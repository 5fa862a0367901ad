"""Over-saturation: a load point whose requests come faster than the server completes them. Its figures
describe a queue that grows for as long as the point lasts, not the server at that load, so the point is
flagged (`saturated`, with a short `saturation_reason`).

The rule reads the point's requests in the order they were due (an open loop's arrival times, else when
each was sent), each with its TTFT counted from then (so that a wait for a --max-concurrency place counts):
- TTFT rising: the least-squares slope of TTFT against the due time is positive, and the median TTFT of
  the last quarter of the requests is at least `ttft_growth` times the lower tenth (p10) of the first
  quarter's (what a request that found a free place waited) and at least `ttft_rise_s` above it (a rise
  of milliseconds is noise);
- open loops (request rates, replays) only, since a closed loop sends only when a request ends:
  the backlog rising (requests due and not yet finished, on average over the last quarter of the arrivals'
  span, at least `in_flight_growth` times their average over the first quarter plus `in_flight_rise`), and
  the answers short: over the arrivals' span the server answered (its first token) at under `rate_share`
  of the arrivals' own rate. A request due at d is answered at d + TTFT(d), so the answers come at the
  arrivals' rate divided by 1 + the TTFT's slope: a server that keeps up answers as fast as requests come,
  however long each then takes. Not completions: a short point may complete none while its arrivals last,
  and a batch finishes in a burst. At 40 req/s on `llmopt serve` 60 arrivals came in 1.7 s (35.2 req/s as
  drawn), all 60 requests shared one batch and finished 5 s (the issue's round) or 15 s (a round beside
  other work, tests/bench/data/rate_40_short_point.jsonl) after the last arrival, within 0.6 s of each
  other: completions from the first to the last read 100 and 116 req/s, the drain, and left it unflagged.
- closed loops (concurrency, sessions) only: the TTFT rise is at least `queue_share` of a request's time
  in service (the first quarter's lower tenth of send to end), since a request queued for a place waits
  for another's end, while one batched behind others' prefills waits a step or two. At 4 streams on
  `llmopt serve`'s 16 places the requests ran in waves of four 1.4 s requests, the first prefilled
  in each wave answered at 90-180 ms and the others at 330-360 ms: TTFT alone flagged that point.
An open loop is saturated when all three of its signals hold, a closed loop when both of its hold: with
queueing the first requests find free places and the later ones wait behind the others (a stub of N
slots is flagged from concurrency 2N on, never at N or below). Multi-turn points are judged on their
first turns only (later turns replay longer histories: their TTFT grows by design). A point with fewer
than `min_requests` answered requests is not judged (never saturated), nor is a closed loop of one in
flight, which nothing can queue behind."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from llmopt.bench.load.load_point import LoadPoint, PointResult
from llmopt.bench.schema import RequestRecord

SAMPLES = 20  # instants at which the early and the late backlog are counted


@dataclass(frozen=True)
class SaturationRule:
    """The thresholds: shares and counts of requests, no rates, so that they hold for a server of any
    capacity; only `ttft_rise_s` is a time. On simulated queues of 1, 4 and 16 slots (test_saturation.py)
    at twice and five times the capacity every point of constant arrivals is flagged from 20 requests,
    of Poisson arrivals every draw of 60 requests or more (30 at five times); none at half the capacity,
    nor at 90 % of constant arrivals; of Poisson draws asked at 90 % at most 4 in 100 that came under the
    capacity, each within 20 % of it, as a queue near capacity grows by chance."""

    min_requests: int = 20
    part: float = 0.25  # the early and the late part: this share of the requests (of the arrivals' span)
    ttft_growth: float = 1.5
    ttft_rise_s: float = 0.05
    in_flight_growth: float = 2.0
    in_flight_rise: float = 4.0
    rate_share: float = 0.9
    queue_share: float = 0.5


DEFAULT_RULE = SaturationRule()


@dataclass(frozen=True)
class Sent:
    """One request as the rule sees it (seconds from the point's start)."""

    due: float  # its arrival time (open loop), else when it was sent
    ttft: float | None  # from `due`; None: not answered (yet)
    end: float | None  # None: still in flight


@dataclass
class Signals:
    """What the rule measured of a point (None where it does not apply or could not be measured)."""

    judged: bool
    open_loop: bool
    ttft_early_s: float | None = None  # the first quarter's lower tenth
    ttft_late_s: float | None = None  # the last quarter's median
    ttft_slope: float | None = None  # seconds of TTFT per second of the point
    service_s: float | None = None  # a closed loop's early lower tenth of send to end
    in_flight_early: float | None = None
    in_flight_late: float | None = None
    offered_rate: float | None = None  # arrivals per second, as the point's arrivals came
    answer_rate: float | None = None  # first tokens per second over the arrivals' span

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    saturated: bool
    reason: str | None  # what held, for a saturated point
    signals: Signals


def is_open_loop(point: LoadPoint) -> bool:
    """Whether the point's requests arrive at times of their own (a request rate or a replay)."""
    return point.request_rate is not None or point.replay_speed is not None


def one_at_a_time(point: LoadPoint) -> bool:
    """A closed loop of one request (or session) in flight: nothing can queue behind it, so a TTFT that
    rises there is other work on the machine, not saturation (such a point was flagged beside a CPU-heavy
    process), and it is not judged."""
    return not is_open_loop(point) and point.session_rate is None and 1 in (point.concurrency, point.sessions)


def sent_of(point: LoadPoint, records: list[RequestRecord], times: list[float] | None) -> list[Sent]:
    """The answered requests among `records`, due at `times[index]` (an open loop's arrivals) or when sent."""
    out = []
    for r in records:
        if not r.success or r.ttft is None or r.e2e is None or (r.turn or 0) > 0:
            continue
        due = times[r.index] if times is not None and r.index < len(times) else r.start
        out.append(Sent(due, r.start - due + r.ttft, r.start + r.e2e))
    return out


def arrival_schedule(point: LoadPoint) -> list[float] | None:
    """An open loop's arrival times (None for any other point)."""
    return point.arrivals(point.num_requests) if is_open_loop(point) else None


def measure(sent: list[Sent], open_loop: bool, rule: SaturationRule = DEFAULT_RULE) -> Signals:
    answered = sorted((s for s in sent if s.ttft is not None), key=lambda s: s.due)
    if len(answered) < rule.min_requests:
        return Signals(False, open_loop)
    k = max(3, round(len(answered) * rule.part))
    dues = [s.due for s in answered]
    ttfts = [s.ttft for s in answered]
    slope = float(np.polyfit(dues, ttfts, 1)[0]) if max(dues) > min(dues) else 0.0
    # Early: the lower tenth, a request that found a free place (a closed loop's first wave queues too).
    early, late = float(np.percentile(ttfts[:k], 10)), float(np.median(ttfts[-k:]))
    signals = Signals(True, open_loop, early, late, slope)
    if open_loop:
        signals.in_flight_early, signals.in_flight_late = backlog(sent, rule.part)
        signals.offered_rate = offered_rate(sent)
        signals.answer_rate = answer_rate(signals.offered_rate, slope)
    else:
        ends = [s.end - s.due for s in answered[:k] if s.end is not None]
        signals.service_s = float(np.percentile(ends, 10)) if ends else None
    return signals


def in_flight(sent: list[Sent], t: float) -> int:
    return sum(1 for s in sent if s.due <= t and (s.end is None or s.end > t))


def backlog(sent: list[Sent], part: float) -> tuple[float, float]:
    """Requests due and unfinished, on average over the first and over the last `part` of the arrivals'
    span (averages: a burst of Poisson arrivals is a moment's backlog, a saturated server's grows)."""
    first, last = min(s.due for s in sent), max(s.due for s in sent)
    width = part * (last - first)

    def mean(start: float) -> float:
        instants = np.linspace(start, start + width, SAMPLES)
        return float(np.mean([in_flight(sent, t) for t in instants]))

    return mean(first), mean(last - width)


def offered_rate(sent: list[Sent]) -> float | None:
    """Arrivals per second over the arrivals' span (for a Poisson draw of a few dozen, up to 20 % off
    the asked rate, so the point is judged against the arrivals it had)."""
    dues = sorted(s.due for s in sent)
    return (len(dues) - 1) / (dues[-1] - dues[0]) if dues[-1] > dues[0] else None


def answer_rate(offered: float | None, ttft_slope: float) -> float | None:
    """First tokens per second while the arrivals came: a request due at d is answered at d + TTFT(d),
    whose least-squares slope against d is 1 + the TTFT's, so the answers come at the offered rate over
    that. A constant wait, however long, leaves the rate as offered; a wait growing by s seconds per
    second of arrivals divides it by 1 + s."""
    return offered / (1 + ttft_slope) if offered is not None and ttft_slope > -1 else None


def judge(s: Signals, rule: SaturationRule = DEFAULT_RULE) -> Verdict:
    if not s.judged:
        return Verdict(False, None, s)
    early, late = s.ttft_early_s, s.ttft_late_s
    ttft = s.ttft_slope > 0 and late >= rule.ttft_growth * early and late - early >= rule.ttft_rise_s
    held = [f"TTFT {early * 1000:,.0f} ms early (p10) -> {late * 1000:,.0f} ms late (median)"]
    if s.open_loop:
        rising = s.in_flight_late >= rule.in_flight_growth * s.in_flight_early + rule.in_flight_rise
        offered, answered = s.offered_rate, s.answer_rate
        short = offered is not None and answered is not None and answered < rule.rate_share * offered
        ttft = ttft and rising and short
        if ttft:
            held.append(f"{s.in_flight_early:.1f} -> {s.in_flight_late:.1f} requests in flight")
            held.append(f"first tokens at {answered:.2f} of {offered:.2f} req/s ({answered / offered:.0%})")
    else:
        queued = s.service_s is not None and late - early >= rule.queue_share * s.service_s
        ttft = ttft and queued
        if ttft:
            held.append(f"a wait of {(late - early) / s.service_s:.0%} of a request's {s.service_s:.2f} s")
    return Verdict(ttft, "; ".join(held) if ttft else None, s)


def run_verdict(point: LoadPoint, result: PointResult, rule: SaturationRule = DEFAULT_RULE) -> Verdict:
    """One run of a point judged from its records; a run stopped by --stop-on-saturation is saturated
    with the reason its online check gave (stopped early, its records alone may no longer show it)."""
    if one_at_a_time(point):
        return Verdict(False, None, Signals(False, False))
    times = arrival_schedule(point)
    verdict = judge(measure(sent_of(point, result.records, times), times is not None, rule), rule)
    if result.saturation is not None and not verdict.saturated:
        return Verdict(True, result.saturation, verdict.signals)
    return verdict


def saturation_fields(point: LoadPoint, results: list[PointResult]) -> dict:
    """A point summary's `saturated`, `saturation_reason` and `saturation` (the signals measured), over
    its runs: saturated when any run was (its signals then, else the first run's)."""
    verdicts = [run_verdict(point, result) for result in results]
    shown = next((v for v in verdicts if v.saturated), verdicts[0])
    return {
        "saturated": shown.saturated,
        "saturation_reason": shown.reason,
        "saturation": shown.signals.to_json(),
    }
