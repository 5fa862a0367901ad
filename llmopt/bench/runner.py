"""One load point: a fixed concurrency (closed loop) or an arrival rate (open loop, Poisson, gamma or
constant, under a concurrency cap), bounded by a request count and a time limit, after warm-up. A
multi-turn workload's points count sessions instead (session.py drives them)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import IO

import aiohttp

from llmopt.bench.arrivals import ARRIVALS, arrival_times
from llmopt.bench.client import BenchRequest, RequestRecord, Target, send


@dataclass
class LoadPoint:
    concurrency: int | None = None  # closed loop: this many requests in flight
    request_rate: float | None = None  # open loop: requests per second
    arrival: str = "poisson"  # or "constant"
    max_concurrency: int | None = None  # cap for the open loop (in sessions for session points)
    num_requests: int = 64
    max_seconds: float | None = None
    warmup: int = 0
    max_error_rate: float | None = None  # stop the point once more than this share has failed
    seed: int = 0
    warmup_requests: list[BenchRequest] | None = None  # default: the first `warmup` of the point's own
    sessions: int | None = None  # multi-turn closed loop: this many sessions at once
    session_rate: float | None = None  # multi-turn open loop: sessions started per second
    burstiness: float = 1.0  # gamma shape of Poisson arrivals: 1 Poisson, < 1 burstier (vllm bench serve)
    ramp_up_s: float = 0.0  # the arrival rate grows linearly from 0 over this many seconds
    think_time: float = 0.0  # multi-turn: seconds between an answer and the session's next turn
    stream: bool = True

    def __post_init__(self) -> None:
        loads = [self.concurrency, self.request_rate, self.sessions, self.session_rate]
        if sum(load is not None for load in loads) != 1:
            raise ValueError(
                "a load point has one of a concurrency, a request rate, sessions or a session rate"
            )
        if any(n is not None and n < 1 for n in (self.concurrency, self.sessions)):
            raise ValueError("concurrency and sessions must be at least 1")
        if any(r is not None and r <= 0 for r in (self.request_rate, self.session_rate)):
            raise ValueError("request and session rates must be positive")
        if self.arrival not in ARRIVALS:
            raise ValueError("arrival must be 'poisson' or 'constant'")
        if not self.burstiness > 0 or self.ramp_up_s < 0 or self.think_time < 0:
            raise ValueError("burstiness must be positive, ramp-up and think time not negative")

    @property
    def rate(self) -> float | None:
        """Arrivals per second of an open loop: requests, or sessions for a session point."""
        return self.request_rate if self.request_rate is not None else self.session_rate

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            load = f"concurrency={self.concurrency}"
        elif self.sessions is not None:
            load = f"sessions={self.sessions}"
        elif self.request_rate is not None:
            load = f"rate={self.request_rate:g}/s"
        else:
            load = f"session-rate={self.session_rate:g}/s"
        # Only settings that differ from the default name a point, so earlier runs' keys stay as they were.
        if self.rate is not None and self.arrival == "poisson" and self.burstiness != 1.0:
            load += f",burstiness={self.burstiness:g}"
        if self.rate is not None and self.ramp_up_s:
            load += f",ramp-up={self.ramp_up_s:g}s"
        return load if self.stream else load + ",no-stream"


@dataclass
class PointResult:
    records: list[RequestRecord]
    wall_s: float
    stopped_early: str | None = None
    tools: str | None = None  # agent points: "sent", or why the server's refusal made them text


class Collector:
    """Takes each finished record of a point: keeps it, writes it to `records_out` at once (one JSON
    line, tagged with the point's key, so an interrupted run keeps everything that finished), and says
    when the point should stop (`stop` holds the reason: more failed than `max_error_rate`)."""

    def __init__(
        self,
        point: LoadPoint,
        records_out: IO[str] | None = None,
        point_key: str | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
    ):
        self.point, self.records_out, self.point_key, self.on_record = (
            point,
            records_out,
            point_key,
            on_record,
        )
        self.records: list[RequestRecord] = []
        self.failed = 0
        self.stop: list[str] = []  # a list, shared with the loops: non-empty means stop sending

    def __call__(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.records_out is not None:
            self.records_out.write(record.to_json(point=self.point_key) + "\n")
            self.records_out.flush()
        if self.on_record is not None:
            self.on_record(record)
        self.failed += not record.success
        limit, done = self.point.max_error_rate, len(self.records)
        if limit is not None and done >= 10 and self.failed / done > limit and not self.stop:
            self.stop.append(f"error rate {self.failed}/{done} above {limit:g}")


async def warm_up(
    session, target: Target, point: LoadPoint, requests: list[BenchRequest], count_tokens
) -> None:
    """`point.warmup` uncounted requests (the point's own warm-up prompts, else its first ones)."""
    pool = point.warmup_requests or requests
    if not point.warmup or not pool:
        return
    warm = [pool[i % len(pool)] for i in range(point.warmup)]
    width = point.concurrency or point.sessions or point.max_concurrency or point.warmup
    await _closed_loop(session, target, warm, width, None, None, lambda r: None, count_tokens)


async def run_point(
    target: Target,
    requests: list[BenchRequest],
    point: LoadPoint,
    records_out: IO[str] | None = None,
    point_key: str | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> PointResult:
    """Drive one load point of single requests (see Collector for what happens to each record)."""
    assert point.sessions is None and point.session_rate is None, "session points run in session.py"
    async with client_session(target) as session:
        await warm_up(session, target, point, requests, count_tokens)
        collect = Collector(point, records_out, point_key, on_record)
        work = [requests[i % len(requests)] for i in range(point.num_requests)]
        t0 = time.perf_counter()
        deadline = t0 + point.max_seconds if point.max_seconds else None
        if point.concurrency is not None:
            await _closed_loop(
                session, target, work, point.concurrency, deadline, collect.stop, collect, count_tokens, t0
            )
        else:
            await _open_loop(session, target, work, point, deadline, collect.stop, collect, count_tokens, t0)
        wall = time.perf_counter() - t0
    return PointResult(collect.records, wall, collect.stop[0] if collect.stop else None)


def client_session(target: Target) -> aiohttp.ClientSession:
    """The session a load point sends through.

    No total timeout: a long answer may take as long as it takes, as long as it keeps coming; a server
    that stops sending fails the request after `target.timeout_s`. Idle keep-alive connections are
    dropped after 3 s, before servers drop them (llama.cpp's and uvicorn's after 5 s): the bench never
    re-sends a request, so it must not send one on a connection the server is closing."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.timeout_s, sock_read=target.timeout_s)
    if target.connection_reuse:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3)
    else:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    return aiohttp.ClientSession(timeout=timeout, connector=connector)


async def _closed_loop(session, target, work, width, deadline, stop, finished, count_tokens, t0=None) -> None:
    t0 = t0 if t0 is not None else time.perf_counter()
    counter = itertools.count()

    async def worker() -> None:
        while True:
            i = next(counter)
            if i >= len(work) or (stop and stop[0]) or (deadline and time.perf_counter() >= deadline):
                return
            finished(await send(session, target, work[i], i, t0, count_tokens))

    await asyncio.gather(*(worker() for _ in range(min(width, len(work)))))


async def _open_loop(
    session, target, work, point: LoadPoint, deadline, stop, finished, count_tokens, t0
) -> None:
    async def one(i: int) -> None:
        finished(await send(session, target, work[i], i, t0, count_tokens))

    await open_loop(len(work), point, deadline, stop, t0, one)


async def open_loop(
    n: int,
    point: LoadPoint,
    deadline: float | None,
    stop: list[str],
    t0: float,
    job: Callable[[int], Awaitable[None]],
) -> None:
    """Start `job(i)` for i < n at the point's arrival times (relative to `t0`), at most
    `point.max_concurrency` at once (an arrival waits for a free place); stop starting at `deadline`
    or once `stop` holds a reason. Returns when every started job has ended."""
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    tasks: list[asyncio.Task] = []

    async def one(i: int) -> None:
        if limit is None:
            await job(i)
            return
        async with limit:
            await job(i)

    times = arrival_times(n, point.rate, point.arrival, point.burstiness, point.ramp_up_s, point.seed)
    for i, due in enumerate(times):
        if stop or (deadline and time.perf_counter() >= deadline):
            break
        delay = t0 + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
