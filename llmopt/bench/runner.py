"""One load point: a fixed concurrency (closed loop) or an arrival rate (open loop, Poisson or
constant, under a concurrency cap), bounded by a request count and a time limit, after warm-up."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import aiohttp

from llmopt.bench.client import BenchRequest, RequestRecord, Target, send


@dataclass
class LoadPoint:
    concurrency: int | None = None  # closed loop: this many requests in flight
    request_rate: float | None = None  # open loop: requests per second
    arrival: str = "poisson"  # or "constant"
    max_concurrency: int | None = None  # cap for the open loop
    num_requests: int = 64
    max_seconds: float | None = None
    warmup: int = 0
    max_error_rate: float | None = None  # stop the point once more than this share has failed
    seed: int = 0
    warmup_requests: list[BenchRequest] | None = None  # default: the first `warmup` of the point's own

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("a load point has either a concurrency or a request rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError("request rate must be positive")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError("arrival must be 'poisson' or 'constant'")

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        return f"rate={self.request_rate:g}/s"


@dataclass
class PointResult:
    records: list[RequestRecord]
    wall_s: float
    stopped_early: str | None = None


async def run_point(
    target: Target,
    requests: list[BenchRequest],
    point: LoadPoint,
    records_out: IO[str] | None = None,
    point_key: str | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> PointResult:
    """Drive one load point. Each finished record is written to `records_out` at once (one JSON line,
    tagged with `point_key`), so an interrupted run keeps everything that finished."""
    async with client_session(target) as session:
        if point.warmup:
            pool = point.warmup_requests or requests
            warm = [pool[i % len(pool)] for i in range(point.warmup)]
            width = point.concurrency or point.max_concurrency or point.warmup
            await _closed_loop(session, target, warm, width, None, None, lambda r: None, count_tokens)

        records: list[RequestRecord] = []
        failed = 0
        stop: list[str] = []

        def finished(record: RequestRecord) -> None:
            nonlocal failed
            records.append(record)
            if records_out is not None:
                records_out.write(record.to_json(point=point_key) + "\n")
                records_out.flush()
            if on_record is not None:
                on_record(record)
            failed += not record.success
            if (
                point.max_error_rate is not None
                and len(records) >= 10
                and failed / len(records) > point.max_error_rate
            ):
                if not stop:
                    stop.append(f"error rate {failed}/{len(records)} above {point.max_error_rate:g}")

        work = [requests[i % len(requests)] for i in range(point.num_requests)]
        t0 = time.perf_counter()
        deadline = t0 + point.max_seconds if point.max_seconds else None
        if point.concurrency is not None:
            await _closed_loop(
                session, target, work, point.concurrency, deadline, stop, finished, count_tokens, t0
            )
        else:
            await _open_loop(session, target, work, point, deadline, stop, finished, count_tokens, t0)
        wall = time.perf_counter() - t0
    return PointResult(records, wall, stop[0] if stop else None)


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
    rng = random.Random(point.seed)
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    tasks: list[asyncio.Task] = []

    async def one(i: int) -> None:
        if limit is None:
            finished(await send(session, target, work[i], i, t0, count_tokens))
            return
        async with limit:
            finished(await send(session, target, work[i], i, t0, count_tokens))

    next_time = t0
    for i in range(len(work)):
        if stop or (deadline and time.perf_counter() >= deadline):
            break
        delay = next_time - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
        gap = 1 / point.request_rate
        next_time += rng.expovariate(point.request_rate) if point.arrival == "poisson" else gap
    await asyncio.gather(*tasks)
