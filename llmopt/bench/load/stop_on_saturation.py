"""`--stop-on-saturation`: a point is checked while it runs, every WATCH_INTERVAL_S, by the rule of
saturation.py over the records finished so far and the requests due and not yet finished; once it holds,
the point stops sending (the requests already sent finish and are kept) and the sweep skips the higher
loads of the point's series: the same server, prompt and output length, load axis, stream setting and
habit, at a higher concurrency, rate, sessions or replay speed than a point that saturated."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator

from llmopt.bench.load.load_point import Collector, LoadPoint
from llmopt.bench.load.saturation import (
    DEFAULT_RULE,
    Sent,
    arrival_schedule,
    judge,
    measure,
    one_at_a_time,
    sent_of,
)
from llmopt.bench.schema import PointSummary

WATCH_INTERVAL_S = 1.0
STOP_REASON = "saturated (--stop-on-saturation)"
LOADS = ("concurrency", "request_rate", "sessions", "session_rate", "replay_speed")


def sent_so_far(point: LoadPoint, collect: Collector, times: list[float] | None, now: float) -> list[Sent]:
    """The point's requests as the rule sees them `now` (seconds from its start): those finished, and for
    an open loop those due by now (never past --max-seconds) that have not finished, still in flight."""
    sent = sent_of(point, collect.records, times)
    if times is None:
        return sent
    horizon = min(now, point.max_seconds) if point.max_seconds else now
    finished = {r.index for r in collect.records}
    due = bisect.bisect_right(times, horizon)
    return sent + [Sent(times[i], None, None) for i in range(due) if i not in finished]


async def watch(point: LoadPoint, collect: Collector, t0: float) -> None:
    """Until the point stops: check it every WATCH_INTERVAL_S; once saturated, stop it saying why."""
    if one_at_a_time(point):
        return
    times = arrival_schedule(point)
    while not collect.stop:
        await asyncio.sleep(WATCH_INTERVAL_S)
        now = time.perf_counter() - t0
        verdict = judge(measure(sent_so_far(point, collect, times, now), times is not None, DEFAULT_RULE))
        if verdict.saturated and not collect.stop:
            collect.saturated = verdict.reason
            collect.stop.append(STOP_REASON)


@contextlib.asynccontextmanager
async def watching(point: LoadPoint, collect: Collector, t0: float) -> AsyncIterator[None]:
    """Watch the point while the body drives it (only when it asks: `point.stop_on_saturation`)."""
    if not point.stop_on_saturation:
        yield
        return
    task = asyncio.create_task(watch(point, collect, t0))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def load_of(point: LoadPoint) -> tuple[str, float]:
    axis = next(a for a in LOADS if getattr(point, a) is not None)
    return axis, getattr(point, axis)


def skip_reason(done: list[PointSummary], server: str, cell: tuple[int, int, LoadPoint]) -> str | None:
    """Why the sweep skips the point of `cell` (prompt length, output length, load point): a finished
    point of its series at a lower load saturated (None: run it). `done` holds the run's finished point
    summaries, so a resumed run skips the same."""
    prompt_len, output_len, point = cell
    axis, load = load_of(point)
    for p in done:
        same = (p.server, p.prompt_len, p.output_len, p.stream, p.habit)
        if same != (server, prompt_len, output_len, point.stream, point.habit):
            continue
        if p.saturated and p.figure(axis) is not None and p.figure(axis) < load:
            return f"{p.load} saturated ({p.saturation_reason}), so no higher {axis} runs"
    return None
