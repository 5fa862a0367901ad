"""One load point: a fixed concurrency (closed loop) or an arrival rate (open loop, Poisson, gamma or
constant, under a concurrency cap), bounded by a request count and a time limit, after warm-up. A
multi-turn workload's points count sessions instead (session.py drives them). With `workers` above 1 the
point's load comes from that many processes (workers.py). Every point measures the client itself too
(self_check.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO

import aiohttp

from llmopt.bench.arrivals import ARRIVALS, arrival_times
from llmopt.bench.client import BenchRequest, RequestRecord, Target, send
from llmopt.bench.self_check import ClientLoad, SelfCheck


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
    replay_speed: float | None = None  # replay: the trace's times divided by this (2.0: twice as fast)
    schedule: list[float] | None = None  # replay: each request's send time in the trace, in seconds
    stream: bool = True
    workers: int = 1  # client processes that share the point's load (workers.py); not part of its label
    habit: str | None = None  # a client habit's point (habit.py): its name ends the label
    # With rounds (rounds.py): which run of the point this is; its records say so, for --resume.
    run: int | None = None

    def __post_init__(self) -> None:
        loads = [self.concurrency, self.request_rate, self.sessions, self.session_rate, self.replay_speed]
        if sum(load is not None for load in loads) != 1:
            raise ValueError(
                "a load point has one of a concurrency, a request rate, sessions, a session rate or a "
                "replay speed"
            )
        if (self.replay_speed is None) != (self.schedule is None):
            raise ValueError("a replay point has a replay speed and a trace's schedule, others neither")
        if any(n is not None and n < 1 for n in (self.concurrency, self.sessions)):
            raise ValueError("concurrency and sessions must be at least 1")
        if any(r is not None and r <= 0 for r in (self.request_rate, self.session_rate, self.replay_speed)):
            raise ValueError("request and session rates and replay speeds must be positive")
        if self.arrival not in ARRIVALS:
            raise ValueError("arrival must be 'poisson' or 'constant'")
        if not self.burstiness > 0 or self.ramp_up_s < 0 or self.think_time < 0:
            raise ValueError("burstiness must be positive, ramp-up and think time not negative")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")

    @property
    def rate(self) -> float | None:
        """Arrivals per second of an open loop: requests, or sessions for a session point."""
        return self.request_rate if self.request_rate is not None else self.session_rate

    def arrivals(self, n: int) -> list[float]:
        """The send times of an open loop's first `n` arrivals, in seconds after its start."""
        if self.replay_speed is not None:
            assert self.schedule is not None and n <= len(self.schedule)
            return [t / self.replay_speed for t in self.schedule[:n]]
        return arrival_times(n, self.rate, self.arrival, self.burstiness, self.ramp_up_s, self.seed)

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            load = f"concurrency={self.concurrency}"
        elif self.sessions is not None:
            load = f"sessions={self.sessions}"
        elif self.request_rate is not None:
            load = f"rate={self.request_rate:g}/s"
        elif self.replay_speed is not None:
            load = f"replay-speed={self.replay_speed:g}x"
        else:
            load = f"session-rate={self.session_rate:g}/s"
        # Only settings that differ from the default name a point, so earlier runs' keys stay as they were.
        if self.rate is not None and self.arrival == "poisson" and self.burstiness != 1.0:
            load += f",burstiness={self.burstiness:g}"
        if self.rate is not None and self.ramp_up_s:
            load += f",ramp-up={self.ramp_up_s:g}s"
        load = load if self.stream else load + ",no-stream"
        return load if self.habit is None else f"{load},habit={self.habit}"


@dataclass
class PointResult:
    records: list[RequestRecord]
    wall_s: float
    stopped_early: str | None = None
    tools: str | None = None  # agent points: "sent", or why the server's refusal made them text
    client: list[ClientLoad] = field(default_factory=list)  # each client process's self-check
    workers: int = 1  # how many processes sent the point's requests
    started: float | None = None  # perf_counter() at the point's start, where records' `start` count from


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
            tags = {"run": self.point.run} if self.point.run is not None else {}
            self.records_out.write(record.to_json(point=self.point_key, **tags) + "\n")
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
    warm = warm_list(point, requests)
    if not warm:
        return
    width = point.concurrency or point.sessions or point.max_concurrency or point.warmup
    await _closed_loop(session, target, warm, width, None, None, lambda r: None, count_tokens)


def warm_list(point: LoadPoint, requests: list[BenchRequest]) -> list[BenchRequest]:
    """The point's `warmup` warm-up requests: its own warm-up prompts, else its first ones, in turn."""
    pool = point.warmup_requests or requests
    return [pool[i % len(pool)] for i in range(point.warmup)] if pool else []


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
    collect = Collector(point, records_out, point_key, on_record)
    work = [requests[i % len(requests)] for i in range(point.num_requests)]
    if point.workers > 1:
        from llmopt.bench.workers import run_in_workers  # it builds on this module: imported when used

        return await run_in_workers(target, work, warm_list(point, requests), point, collect, count_tokens)
    async with client_session(target) as session:
        await warm_up(session, target, point, requests, count_tokens)
        check = SelfCheck().start()
        t0 = time.perf_counter()
        await drive(session, target, work, point, t0, collect.stop, collect, count_tokens)
        wall = time.perf_counter() - t0
        load = check.stop()
    stopped = collect.stop[0] if collect.stop else None
    return PointResult(collect.records, wall, stopped, client=[load], started=t0)


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
    dropped after 3 s, before servers drop them (llama.cpp's and uvicorn's after 5 s): the bench never
    re-sends a request, so it must not send one on a connection the server is closing."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.timeout_s, sock_read=target.timeout_s)
    if target.connection_reuse:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3)
    else:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    return aiohttp.ClientSession(timeout=timeout, connector=connector)


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
    starting at `deadline` or once `stop` holds a reason. Returns when every started job has ended."""
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    tasks: list[asyncio.Task] = []

    async def one(i: int) -> None:
        if limit is None:
            await job(i)
            return
        async with limit:
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
