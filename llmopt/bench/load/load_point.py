"""The bench's run model: a load point (the load to apply and for how long), what one run of it measured
(PointResult, and with what the sweep kept beside it, Run), the runs of a point on one server start
(Measured), and the Collector every finished record goes through. Everything that drives, sweeps or
reports points imports these from here, and this imports nothing that drives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from llmopt.bench.load.arrivals import ARRIVALS, arrival_times
from llmopt.bench.load.client import BenchRequest
from llmopt.bench.load.self_check import ClientLoad, client_summary
from llmopt.bench.observe.machine_meter import MachineUse
from llmopt.bench.observe.server_metrics import ServerSample
from llmopt.bench.schema import RequestRecord


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
    # End the point once it saturates (stop_on_saturation.py checks every second or so while it runs)
    stop_on_saturation: bool = False

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
    machine: MachineUse | None = None  # what the serving machine spent over it (machine_meter.py)
    saturation: str | None = None  # why --stop-on-saturation ended it (saturation.py), if it did


@dataclass
class Run:
    """One run of a point (a point runs --num-runs times, in each of its rounds)."""

    result: PointResult
    planned_turns: dict[int, int]  # multi-turn runs: each session's number of turns
    reset: bool | None  # whether the prefix cache was reset before it (None: not asked to)
    warnings: list[str]
    samples: list[ServerSample] = field(default_factory=list)  # the server's /metrics during it
    repeat: int = 0  # its number among the point's runs: what seeds its prompts


@dataclass
class Measured:
    """The runs of a point on one server start: all of them, or one round's (rounds.py)."""

    runs: list[Run]
    spec: dict[str, float] | None = None  # the speculation counters' growth over them (server_stats.py)


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
        self.saturated: str | None = None  # set (with a stop) by the --stop-on-saturation watcher

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

    def result(
        self,
        wall_s: float,
        tools: str | None,
        client: list[ClientLoad],
        started: float,
        machine: MachineUse | None,
        workers: int = 1,
    ) -> PointResult:
        """The point's result once its loops have ended: its records, and why it stopped early or
        saturated, if it did, with what the processes that sent it measured."""
        stopped = self.stop[0] if self.stop else None
        return PointResult(
            self.records,
            wall_s,
            stopped,
            tools,
            client=client,
            workers=workers,
            started=started,
            machine=machine,
            saturation=self.saturated,
        )


def warm_list(point: LoadPoint, requests: list[BenchRequest]) -> list[BenchRequest]:
    """The point's `warmup` warm-up requests: its own warm-up prompts, else its first ones, in turn."""
    pool = point.warmup_requests or requests
    return [pool[i % len(pool)] for i in range(point.warmup)] if pool else []


def client_fields(results: list[PointResult]) -> dict:
    """A point summary's `client` block and `client_limited` flag, over the runs of the point."""
    block = client_summary([load for r in results for load in r.client], max(r.workers for r in results))
    return {"client": block, "client_limited": block["limited"]}
