"""Run one load point: a fixed concurrency (closed loop) or an arrival rate (open loop, Poisson, gamma or
constant, under a concurrency cap), bounded by a request count and a time limit, after warm-up; or a
multi-turn point of sessions (session.py drives them). In this process (loops.py), or with `workers`
above 1 from that many processes (workers.py). Every point measures the client itself too
(self_check.py), and with a `meter` what the serving machine spent from its start to its end
(machine_meter.py). The point and its result are load_point.py's."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import IO

import aiohttp

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import Collector, LoadPoint, PointResult, warm_list
from llmopt.bench.load.loops import client_session, drive, warm_up
from llmopt.bench.load.self_check import SelfCheck
from llmopt.bench.load.session import drive_sessions
from llmopt.bench.load.stop_on_saturation import watching
from llmopt.bench.load.workers import run_in_workers
from llmopt.bench.observe.machine_meter import MachineMeter
from llmopt.bench.schema import RequestRecord
from llmopt.bench.workload.conversation import Conversation


async def run_point(
    target: Target,
    requests: list[BenchRequest],
    point: LoadPoint,
    records_out: IO[str] | None = None,
    point_key: str | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    meter: MachineMeter | None = None,
) -> PointResult:
    """Drive one load point of single requests (see Collector for what happens to each record)."""
    assert point.sessions is None and point.session_rate is None, "session points run in session.py"
    collect = Collector(point, records_out, point_key, on_record)
    work = [requests[i % len(requests)] for i in range(point.num_requests)]
    if point.workers > 1:
        warm = warm_list(point, requests)
        return await run_in_workers(target, work, warm, point, collect, count_tokens, meter=meter)

    async def send(session: aiohttp.ClientSession, t0: float) -> None:
        await drive(session, target, work, point, t0, collect.stop, collect, count_tokens)

    return await measured(target, point, collect, requests, count_tokens, meter, send)


async def run_sessions(
    target: Target,
    conversations: list[Conversation],
    point: LoadPoint,
    records_out: IO[str] | None = None,
    point_key: str | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    warmup_requests: list[BenchRequest] | None = None,
    first_session: int = 0,
    meter: MachineMeter | None = None,
) -> PointResult:
    """Run each conversation once as a session of the point; records carry their session (numbered from
    `first_session`: a repeated point's runs number theirs apart) and turn."""
    assert point.sessions is not None or point.session_rate is not None
    collect = Collector(point, records_out, point_key, on_record)
    if point.workers > 1:
        warm = warm_list(point, warmup_requests or [])
        return await run_in_workers(
            target, conversations, warm, point, collect, count_tokens, first_session, meter
        )

    async def send(session: aiohttp.ClientSession, t0: float) -> str | None:
        return await drive_sessions(
            session, target, conversations, point, t0, collect, count_tokens, first_session
        )

    return await measured(target, point, collect, warmup_requests or [], count_tokens, meter, send)


async def measured(
    target: Target,
    point: LoadPoint,
    collect: Collector,
    warmup: list[BenchRequest],
    count_tokens: Callable[[str], int] | None,
    meter: MachineMeter | None,
    send: Callable[[aiohttp.ClientSession, float], Awaitable[str | None]],
) -> PointResult:
    """One point in this process: warm up, then `send(session, t0)` timed, with the client's self-check,
    the machine meter and the --stop-on-saturation watcher around it; what `send` returns is the
    point's `tools`."""
    async with client_session(target) as session:
        await warm_up(session, target, point, warmup, count_tokens)
        if meter is not None:  # before t0: its reads (files, a scrape) are no part of the point's time
            meter.start()
        check = SelfCheck().start()
        t0 = time.perf_counter()
        async with watching(point, collect, t0):  # --stop-on-saturation
            tools = await send(session, t0)
        wall = time.perf_counter() - t0
        load = check.stop()
        machine = meter.stop() if meter is not None else None
    return collect.result(wall, tools, [load], t0, machine)
