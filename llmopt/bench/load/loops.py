"""How one process sends a load point's requests: the closed loop (a fixed number in flight), the open
loop (arrival times, under a concurrency cap), the warm-up, and the HTTP session they share. runner.py
runs a point through these in this process, workers.py in each of its worker processes."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import aiohttp

from llmopt.bench.load.client import BenchRequest, Target, send, timed_session
from llmopt.bench.load.load_point import LoadPoint, warm_list
from llmopt.bench.schema import RequestRecord


async def warm_up(
    session, target: Target, point: LoadPoint, requests: list[BenchRequest], count_tokens
) -> None:
    """`point.warmup` uncounted requests (the point's own warm-up prompts, else its first ones)."""
    warm = warm_list(point, requests)
    if not warm:
        return
    width = point.concurrency or point.sessions or point.max_concurrency or point.warmup
    await _closed_loop(session, target, warm, width, None, None, lambda r: None, count_tokens)


async def drive(
    session: aiohttp.ClientSession,
    target: Target,
    work: list[BenchRequest],
    point: LoadPoint,
    t0: float,
    stop: list[str],
    finished: Callable[[RequestRecord], None],
    count_tokens: Callable[[str], int] | None,
    take: Callable[[], int] | None = None,
    indices: list[int] | None = None,
) -> None:
    """Send the point's `work` from `t0` (a perf_counter time) on, each finished record to `finished`.
    A worker process of a point sends its share: a closed loop's indices come from `take` (a counter the
    processes share), an open loop sends the arrivals numbered in `indices` at their times."""
    deadline = t0 + point.max_seconds if point.max_seconds else None
    if point.concurrency is not None:
        await _closed_loop(
            session, target, work, point.concurrency, deadline, stop, finished, count_tokens, t0, take
        )
        return

    async def one(i: int) -> None:
        finished(await send(session, target, work[i], i, t0, count_tokens))

    await open_loop(len(work), point, deadline, stop, t0, one, indices)


def client_session(target: Target) -> aiohttp.ClientSession:
    """The session a load point sends through.

    No total timeout: a long answer may take as long as it takes, as long as it keeps coming; a server
    that stops sending fails the request after `target.timeout_s`. Idle keep-alive connections are
    dropped after 3 s, before servers drop them (uvicorn's after 5 s); a server that closes one sooner
    (llama.cpp's) costs the request a re-send on a fresh connection (client.py), counted, not a failure."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.timeout_s, sock_read=target.timeout_s)
    if target.connection_reuse:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3)
    else:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    return timed_session(timeout, connector)


async def _closed_loop(
    session, target, work, width, deadline, stop, finished, count_tokens, t0=None, take=None
) -> None:
    t0 = t0 if t0 is not None else time.perf_counter()
    take = take or itertools.count().__next__

    async def worker() -> None:
        while True:
            if (stop and stop[0]) or (deadline and time.perf_counter() >= deadline):
                return
            i = take()
            if i >= len(work):
                return
            finished(await send(session, target, work[i], i, t0, count_tokens))

    await asyncio.gather(*(worker() for _ in range(min(width, len(work)))))


async def open_loop(
    n: int,
    point: LoadPoint,
    deadline: float | None,
    stop: list[str],
    t0: float,
    job: Callable[[int], Awaitable[None]],
    indices: list[int] | None = None,
) -> None:
    """Start `job(i)` for i < n (or i in `indices`, this process's share) at the point's arrival times
    (relative to `t0`), at most `point.max_concurrency` at once (an arrival waits for a free place); stop
    starting at `deadline` or once `stop` holds a reason (an arrival still waiting for a place then is
    dropped). Returns when every started job has ended."""
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    tasks: list[asyncio.Task] = []

    async def one(i: int) -> None:
        if limit is None:
            await job(i)
            return
        async with limit:
            if not stop:  # an arrival that waited for a place while the point stopped is never sent
                await job(i)

    times = point.arrivals(n)
    for i in range(n) if indices is None else indices:
        due = times[i]
        if stop or (deadline and time.perf_counter() >= deadline):
            break
        delay = t0 + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
