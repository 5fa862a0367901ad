"""The client measures itself: over each load point, how late its event loop wakes (a watcher sleeps
10 ms at a time and records by how much it overslept) and how much of one core the loop's thread used.
Every timestamp the client takes is taken when the loop gets round to it, so a late loop adds its lag to
TTFT and ITL; a loop that uses a whole core sets the request rate itself, whatever the server could do.

A point is flagged `client_limited` when
- the loop lag's p99 is above LAG_P99_LIMIT_MS (10 ms): an idle loop wakes well under 1 ms late, and a
  lag this large moves the p99 latencies of a fast server by more than the effects being measured; or
- the busiest client process's loop used more than CPU_LIMIT (90 %) of a core: asyncio runs on one
  core, so at that point the client, not the server, decides how fast requests go out.
The flag reads the loop thread's own CPU time (time.thread_time), not the process's: the process may
also hold threads that are no part of the client (a test's in-process stub server, a tokenizer's pool).
The process's (time.process_time: the loop plus, say, a worker's queue feeder thread) is kept beside
it. A loop lag with a low CPU share means the machine's cores were busy with something else (a
CPU-served model on the same machine): the timings are late all the same, and the flag's reason says
which it was."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from llmopt.bench.distribution import distribution

LAG_INTERVAL_S = 0.010
LAG_P99_LIMIT_MS = 10.0
CPU_LIMIT = 0.90


@dataclass
class ClientLoad:
    """What one client process measured of itself over one run of a point."""

    lag_s: list[float] = field(default_factory=list)  # how late each watcher wake-up was, seconds
    cpu_s: float = 0.0  # CPU time of the event loop's thread
    wall_s: float = 0.0
    process_cpu_s: float = 0.0  # CPU time of the whole process, all its threads

    @property
    def cpu(self) -> float:
        """The loop thread's CPU time as a share of one core."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class SelfCheck:
    """Started on the running loop at a point's start, stopped at its end: `stop()` gives the ClientLoad."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S):
        self.interval_s = interval_s
        self.load = ClientLoad()
        self._task: asyncio.Task | None = None
        self._cpu0 = self._process0 = self._t0 = 0.0
        self._due = float("inf")  # when the watcher should next wake

    def start(self) -> SelfCheck:
        self._cpu0, self._process0, self._t0 = time.thread_time(), time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def _watch(self) -> None:
        while True:
            self._due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.load.lag_s.append(max(0.0, time.perf_counter() - self._due))

    def stop(self) -> ClientLoad:
        assert self._task is not None, "stop() before start()"
        self._task.cancel()
        # A wake-up already due and not yet run is lag too (a point whose loop was blocked to its end).
        if (late := time.perf_counter() - self._due) > 0:
            self.load.lag_s.append(late)
        self.load.cpu_s = time.thread_time() - self._cpu0
        self.load.process_cpu_s = time.process_time() - self._process0
        self.load.wall_s = time.perf_counter() - self._t0
        return self.load


def client_summary(loads: list[ClientLoad], workers: int = 1) -> dict:
    """A point's `client` block from the loads of all its processes and runs: the loop lag pooled over
    every wake-up, the CPU share of the busiest process, and whether (and why) the client was the limit."""
    lag = [x for load in loads for x in load.lag_s]
    lag_ms = distribution(lag, (50, 99))
    lag_ms["max"] = max(lag) * 1000 if lag else None
    cpus = [load.cpu for load in loads]
    cpu = max(cpus) if cpus else None
    process_cpu = [load.process_cpu_s / load.wall_s if load.wall_s > 0 else 0.0 for load in loads]
    reasons = []
    if cpu is not None and cpu > CPU_LIMIT:
        reasons.append(f"the client's event loop used {cpu:.0%} of a core (limit {CPU_LIMIT:.0%})")
    if lag_ms["p99"] is not None and lag_ms["p99"] > LAG_P99_LIMIT_MS:
        cause = "the client is busy" if cpu is not None and cpu > CPU_LIMIT / 2 else "the machine is busy"
        reasons.append(
            f"its event loop woke {lag_ms['p99']:.1f} ms late at p99 (limit {LAG_P99_LIMIT_MS:g} ms; {cause})"
        )
    return {
        "workers": workers,
        "loop_lag_ms": lag_ms,
        "cpu": cpu,
        "cpu_per_process": cpus,
        "process_cpu": max(process_cpu) if process_cpu else None,  # all threads: not what the flag reads
        "limited": bool(reasons),
        "limited_by": reasons,
    }
