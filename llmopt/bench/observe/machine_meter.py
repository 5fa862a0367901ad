"""What a run of a point cost the serving machine in its own terms: the server's CPU seconds and the
machine's joules between the point's start and end, read at both (the warm-up is before the start).

The CPU time is the server's process tree's (process_cpu.py) when the bench started the server itself;
for any other server, the growth of `process_cpu_seconds_total` where its /metrics page has it (the
process that serves the page: vLLM's engine core runs in another one, so for a vLLM endpoint it is a
lower bound); else None, with the reason. The energy is the machine's RAPL counters (rapl.py), read only
when the server runs on this machine (started here, or on a loopback address): it is the whole
machine's, the bench client's share included. Never a guess: without a counter the figure is None and
`energy_source` / `cpu_source` say why.

Where the server publishes the bytes of weights one decode step reads (llmopt's
`llmopt:decode_weight_bytes`), the run records them, and, for a server on this machine, the machine's
measured read bandwidth (memory_bandwidth.py), so the summary can set the decode reads a point implies
beside the machine's limit; other servers publish no such figure, and it is None."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from llmopt.bench.observe.memory_bandwidth import read_bandwidth_gbs
from llmopt.bench.observe.process_cpu import cpu_reader_name, tree_cpu_seconds
from llmopt.bench.observe.rapl import RaplMeter, find_zones
from llmopt.bench.observe.server_stats import scrape

PROCESS_CPU = "process_cpu_seconds_total"
DECODE_WEIGHT_BYTES = "llmopt:decode_weight_bytes"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class MachineUse:
    """One run's reading: seconds between start and stop, the server's CPU seconds and the machine's
    joules over them (None: not available, for the reason in the source)."""

    wall_s: float
    cpu_s: float | None
    cpu_source: str  # "process tree (psutil)", "process tree (/proc)", PROCESS_CPU, or why none
    energy_j: float | None
    energy_source: str  # "rapl", or why none
    energy_domains: list[str] | None = None  # the RAPL zones summed (package-0, dram, ...)
    decode_weight_bytes: float | None = None  # what the server says one decode step reads of its weights
    machine_read_gbs: float | None = None  # this machine's read bandwidth, for a server running here


class TreeCpu:
    """The CPU seconds of a server process the bench started, and of its children."""

    def __init__(self, pid: int):
        self.pid = pid
        self.source = f"process tree ({cpu_reader_name()})"

    def read(self, page: dict[str, float] | None = None) -> float | None:
        return tree_cpu_seconds(self.pid)


class MetricsCpu:
    """A server's own `process_cpu_seconds_total`, scraped from its /metrics page."""

    source = PROCESS_CPU

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url, self.timeout_s = base_url, timeout_s

    def read(self, page: dict[str, float] | None = None) -> float | None:
        """The counter from `page` where one was scraped already, else from a fresh scrape."""
        return (page if page is not None else scrape(self.base_url, self.timeout_s)).get(PROCESS_CPU)


class MachineMeter:
    """`start()` at a point's start and `stop()` at its end give the run's MachineUse."""

    def __init__(
        self,
        cpu: TreeCpu | MetricsCpu,
        energy: RaplMeter | None,
        energy_reason: str | None,
        base_url: str,
        here: bool,
    ):
        self.cpu, self.energy, self.energy_reason = cpu, energy, energy_reason
        self.base_url, self.here = base_url, here
        self._t0 = 0.0
        self._cpu0: float | None = None
        self._weight_bytes: float | None = None

    def start(self) -> None:
        # One scrape serves the CPU counter and the decode weight bytes (fixed for a loaded model), so a
        # point costs the server's page one request at its start and, for a CPU counter, one at its end.
        page = scrape(self.base_url, timeout_s=5.0)
        self._weight_bytes = page.get(DECODE_WEIGHT_BYTES)
        if self.energy is not None:
            self.energy.start()
        self._cpu0 = self.cpu.read(page)
        self._t0 = time.perf_counter()

    def stop(self) -> MachineUse:
        wall = time.perf_counter() - self._t0
        cpu1 = self.cpu.read() if self._cpu0 is not None else None  # not there at the start: not asked again
        joules = self.energy.stop() if self.energy is not None else None
        return MachineUse(wall, *self._cpu(cpu1), *self._energy(joules), *self._decode_reads())

    def _decode_reads(self) -> tuple[float | None, float | None]:
        """The server's decode weight bytes and, when it runs here, the machine's bandwidth (measured
        once per process, after this point's timed window)."""
        if self._weight_bytes is None:
            return None, None
        return self._weight_bytes, read_bandwidth_gbs() if self.here else None

    def _cpu(self, cpu1: float | None) -> tuple[float | None, str]:
        if self._cpu0 is None or cpu1 is None:
            return None, self.unavailable_cpu()
        return max(0.0, cpu1 - self._cpu0), self.cpu.source

    def unavailable_cpu(self) -> str:
        if isinstance(self.cpu, TreeCpu):
            return "the server's process could not be read (it ended?)"
        return f"no {PROCESS_CPU} on the server's /metrics"

    def _energy(self, joules: float | None) -> tuple[float | None, str, list[str] | None]:
        if self.energy is None:
            return None, self.energy_reason or "not available here", None
        if joules is None:
            return None, "a RAPL counter could not be read again", self.energy.domains
        return joules, "rapl", self.energy.domains


class Served(Protocol):
    """What the meter needs of the load's target (load/client.py's Target has it): the observers import
    no other wing."""

    endpoint: str
    server_pid: int | None  # the server's process, where the bench started it


def on_this_machine(target: Served) -> bool:
    """Whether the target's server runs here: the bench started it, or it answers on a loopback address."""
    return target.server_pid is not None or urlsplit(target.endpoint).hostname in LOOPBACK


def machine_meter(target: Served) -> MachineMeter:
    """The meter for one run of a point against `target`."""
    base_url = target.endpoint.rstrip("/").removesuffix("/v1")
    cpu = TreeCpu(target.server_pid) if target.server_pid is not None else MetricsCpu(base_url)
    if not on_this_machine(target):
        return MachineMeter(cpu, None, "the server runs on another machine", base_url, here=False)
    zones, reason = find_zones()
    return MachineMeter(cpu, RaplMeter(zones) if zones else None, reason, base_url, here=True)
