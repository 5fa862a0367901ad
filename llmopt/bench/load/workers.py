"""A load point sent from several client processes (`--workers N`), for rates one event loop cannot drive.

Each worker is a process of its own (multiprocessing with spawn: a fresh interpreter, none of the
parent's threads or open files) with one event loop and its own connections, and sends an exact share:
- closed loop: the concurrency is split, N // W each and one more for the first N % W, so the workers
  hold exactly N requests in flight between them; request numbers come from one counter they share, so
  requests 0..n-1 are sent once each, every free slot taking the next, as in one process. A multi-turn
  point's sessions at once are split the same way, each free slot taking the next conversation, and its
  requests are numbered by a second shared counter, in the order they are sent;
- open loop: every worker computes the whole arrival schedule (same seed) and worker w sends arrivals
  (requests, or sessions started) w, w + W, w + 2W, ... at their times, so the union is the one-process
  schedule. A concurrency cap is split like a concurrency: it holds in total, but an arrival may wait
  in one worker while another has a free place;
- warm-up requests are split the same way: each worker warms its own connections.
A load smaller than W runs on fewer workers (concurrency 2 with 4 workers runs on 2).

One clock: the parent sets the common start as a time.time() instant just ahead, and each worker turns
it once into its own perf_counter time (Python leaves perf_counter's zero undefined across processes;
time.time is one clock for all, and one reading of it is off by microseconds), then times everything
with perf_counter as one process does. So every record's `start` counts from the same instant, and the
point's wall time runs from it to the last answer of any worker. Records come to the parent as they
finish (a queue) and go through the point's Collector (requests.jsonl, progress, the error-rate stop,
which an Event passes on to every worker): summaries are computed over them as over one process's.
A server's refusal of `tools` is found by each worker for itself (each then sends text); the point says
so if any worker met it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import Collector, LoadPoint, PointResult
from llmopt.bench.load.loops import client_session, drive, warm_up
from llmopt.bench.load.self_check import SelfCheck
from llmopt.bench.load.session import drive_sessions, pooled_tools
from llmopt.bench.load.stop_on_saturation import watching
from llmopt.bench.observe.machine_meter import MachineMeter
from llmopt.bench.schema import RequestRecord
from llmopt.bench.workload.conversation import Conversation

START_LEAD_S = 0.05  # between setting the common start and reaching it: every worker is waiting by then
POLL_S = 0.2  # how often the parent looks for a worker that died without a word
STOP_POLL_S = 0.01  # how soon a worker sees the parent's stop


@dataclass
class Share:
    """What one worker sends: its point (its share of the concurrency or sessions, cap and warm-up) and,
    for an open loop, the numbers of the arrivals that are its own."""

    number: int
    point: LoadPoint
    indices: list[int] | None = None
    first_session: int = 0  # multi-turn points: the number of the point's first session

    @property
    def sessions(self) -> bool:
        return self.point.sessions is not None or self.point.session_rate is not None


@dataclass
class Channel:
    """How the parent and its workers talk (multiprocessing objects, passed to each process)."""

    messages: object  # Queue of (kind, worker, payload): "ready", "record", "done", "error"
    go: object  # Event: the common start is set
    stop: object  # Event: stop sending (the parent's Collector said so)
    start_at: object  # Value "d": the common start, a time.time() instant
    counter: object  # Value "q": the next request (or a multi-turn point's conversation) of a closed loop
    numbers: object  # Value "q": a multi-turn point's next request number


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` whole shares, the first `total % parts` one larger."""
    return [total // parts + (k < total % parts) for k in range(parts)]


def shares(point: LoadPoint, n: int, warm: list[BenchRequest], first_session: int = 0) -> list[Share]:
    """Each worker's share of a point of `n` requests (or conversations) and `warm` warm-up requests."""
    closed = "concurrency" if point.concurrency is not None else "sessions" if point.sessions else None
    width = getattr(point, closed) if closed else point.max_concurrency or n
    count = max(1, min(point.workers, width, n))
    widths = split(width, count)
    out = []
    for k in range(count):
        own_warm = warm[k::count]
        # The parent's Collector alone decides on the error rate, over every worker's records.
        replaced = {"workers": 1, "warmup": len(own_warm), "warmup_requests": own_warm or None}
        replaced["max_error_rate"] = None
        if closed:
            own_point = dataclasses.replace(point, **{closed: widths[k]}, **replaced)
            out.append(Share(k, own_point, None, first_session))
        else:
            cap = widths[k] if point.max_concurrency else None
            own_point = dataclasses.replace(point, max_concurrency=cap, **replaced)
            out.append(Share(k, own_point, list(range(k, n, count)), first_session))
    return out


async def run_in_workers(
    target: Target,
    work: list[BenchRequest] | list[Conversation],
    warm: list[BenchRequest],
    point: LoadPoint,
    collect: Collector,
    count_tokens: Callable[[str], int] | None,
    first_session: int = 0,
    meter: MachineMeter | None = None,
) -> PointResult:
    """Run the point's `work` (requests, or a multi-turn point's conversations) from `point.workers`
    processes; every record goes to `collect`. `meter` runs from the go to the last worker's end."""
    ctx = mp.get_context("spawn")
    values = (ctx.Value("d", 0.0), ctx.Value("q", 0), ctx.Value("q", 0))
    channel = Channel(ctx.Queue(), ctx.Event(), ctx.Event(), *values)
    plan = shares(point, len(work), warm, first_session)
    procs = [
        ctx.Process(
            target=worker_main,
            args=(target, work, share, count_tokens, channel),
            name=f"llmopt-bench-worker-{share.number}",
            daemon=True,  # never outlives the bench
        )
        for share in plan
    ]
    try:
        for proc in procs:
            proc.start()
        await receive(channel, procs, collect, "ready")
        if meter is not None:  # START_LEAD_S early: the workers wait for the start, sending nothing
            meter.start()
        channel.start_at.value = time.time() + START_LEAD_S
        started = time.perf_counter() + START_LEAD_S  # the common start on this process's clock
        channel.go.set()
        async with watching(point, collect, started):  # --stop-on-saturation: over every worker's records
            done = await receive(channel, procs, collect, "done")
        machine = meter.stop() if meter is not None else None
    finally:
        channel.stop.set()
        for proc in (p for p in procs if p.pid is not None):  # started ones only
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    wall = max(end for end, _, _ in done.values())
    loads = [load for _, load, _ in done.values()]
    tools = pooled_tools([used for _, _, used in done.values()])
    return collect.result(wall, tools, loads, started, machine, workers=len(plan))


async def receive(channel: Channel, procs: list, collect: Collector, until: str) -> dict[int, object]:
    """Take the workers' messages (records into `collect`) until every worker has sent `until`; return
    those messages' payloads by worker. A worker that failed or died is a BenchError saying how (the
    CLI prints it as one message: the records so far are kept)."""
    got: dict[int, object] = {}
    while len(got) < len(procs):
        batch = await next_messages(channel.messages)
        for kind, number, payload in batch:
            if kind == "record":
                collect(payload)
            elif kind == "error":
                raise BenchError(f"bench worker {number} failed:\n{payload}")
            elif kind == until:
                got[number] = payload
        if collect.stop:  # the error rate, or the saturation watcher (which no record need wake)
            channel.stop.set()
        # A worker's messages are all in the queue once it has exited: a quiet queue means it sent no more.
        dead = [p for k, p in enumerate(procs) if k not in got and p.exitcode is not None]
        if dead and not batch:
            proc = dead[0]
            raise BenchError(f"bench worker {proc.name} ended (exit code {proc.exitcode}) before its share")
    return got


async def next_messages(messages) -> list[tuple]:
    """What is queued, after waiting up to POLL_S for the first (in a thread: the loop stays free to be
    cancelled, by Ctrl-C say); empty if nothing came."""
    try:
        batch = [await asyncio.to_thread(messages.get, True, POLL_S)]
    except queue.Empty:
        return []
    with contextlib.suppress(queue.Empty):
        while True:
            batch.append(messages.get_nowait())
    return batch


def worker_main(
    target: Target,
    work: list[BenchRequest],
    share: Share,
    count_tokens: Callable[[str], int] | None,
    channel: Channel,
) -> None:
    """A worker process: its share of the point, every finished record sent to the parent at once."""
    try:
        asyncio.run(_work(target, work, share, count_tokens, channel))
    except KeyboardInterrupt:
        pass  # Ctrl-C reached the whole process group: the parent stops the point and keeps its records
    except BaseException:  # noqa: BLE001 - whatever else ends a worker, the parent must hear of it
        channel.messages.put(("error", share.number, traceback.format_exc()))


async def _work(
    target: Target,
    work: list[BenchRequest] | list[Conversation],
    share: Share,
    count_tokens: Callable[[str], int] | None,
    channel: Channel,
) -> None:
    def forward(record: RequestRecord) -> None:
        # Without the answer's text (a session keeps its own for the next turn): nothing to copy across.
        channel.messages.put(("record", share.number, dataclasses.replace(record, text=None)))

    async with client_session(target) as session:
        await warm_up(session, target, share.point, [], count_tokens)
        channel.messages.put(("ready", share.number, None))
        while not await asyncio.to_thread(channel.go.wait, 1.0):
            if not mp.parent_process().is_alive():  # the bench was killed: nobody will say go
                return
        t0 = time.perf_counter() + (channel.start_at.value - time.time())
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        check = SelfCheck().start()
        collect = Collector(share.point, on_record=forward)
        watcher = asyncio.create_task(_watch_stop(channel.stop, collect.stop))
        take = shared_counter(channel.counter)
        if share.sessions:
            numbers = iter(shared_counter(channel.numbers), -1)  # never -1: an endless iterator
            args = (count_tokens, share.first_session, take, share.indices, numbers)
            tools = await drive_sessions(session, target, work, share.point, t0, collect, *args)
        else:
            await drive(
                session,
                target,
                work,
                share.point,
                t0,
                collect.stop,
                collect,
                count_tokens,
                take,
                share.indices,
            )
            tools = None
        end = time.perf_counter() - t0
        load = check.stop()
        watcher.cancel()
    channel.messages.put(("done", share.number, (end, load, tools)))


def shared_counter(value) -> Callable[[], int]:
    """0, 1, 2, ... from a multiprocessing Value that every worker counts on."""

    def take() -> int:
        with value.get_lock():
            value.value += 1
            return value.value - 1

    return take


async def _watch_stop(event, stop: list[str]) -> None:
    """Pass the parent's stop on to this worker's loops (they read `stop`)."""
    while not event.is_set():
        await asyncio.sleep(STOP_POLL_S)
    stop.append("stopped by the bench")
