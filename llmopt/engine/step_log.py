"""What each engine step did and cost, and what each request waited for: the engine's own account of
where serving time goes.

Per step (a `StepRecord`): its duration and the engine thread's CPU time in it (far below the duration:
the thread waited for the GIL or for cores), the time it sat idle since the previous step ended (no
work, or its thread busy elsewhere), the prefill tokens and decode rows it computed, the prompt tokens
its admissions took from the prefix cache (from RAM or the disk tier) and the disk tier's traffic (bytes
loaded, blocks evicted to be written). Per request (a `RequestTrace`, at its end): prompt length,
prefix-cache hit (and its part from disk), time queued before its first step, time to first token.
Both go to the DEBUG log (logger `llmopt.engine.step_log`), to observers (benchmarks), and, where
LLMOPT_STEP_TRACE names a file, to that file as JSON lines. Every `interval_s` an INFO line
sums them up, as vLLM's periodic stats line does: throughput, prefix-cache hit rate, busy share.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO

log = logging.getLogger(__name__)
TRACE_ENV = "LLMOPT_STEP_TRACE"


@dataclass
class StepRecord:
    start: float  # perf_counter when the step began
    duration_s: float
    cpu_s: float  # the engine thread's CPU time in the step (its OpenMP workers not counted)
    idle_before_s: float  # since the previous step ended
    schedule_s: float
    forward_s: float  # the model, logits included
    prefill_tokens: int  # of sequences computing more than one token
    prefill_seqs: int
    decode_rows: int
    generated_tokens: int
    num_running: int
    num_waiting: int
    cached_tokens: int = 0  # prompt tokens of the sequences it admitted, from the prefix cache (both tiers)
    disk_hit_tokens: int = 0  # of those, loaded from the disk tier
    disk_read_bytes: int = 0
    disk_write_blocks: int = 0  # evicted cached blocks copied out for the disk tier's writer
    disk_write_bytes: int = 0


@dataclass
class RequestTrace:
    request_id: str
    prompt_tokens: int
    cached_tokens: int  # of the prompt, from the prefix cache (both tiers)
    output_tokens: int
    queue_s: float | None  # arrival to its first scheduled step (None: never scheduled)
    ttft_s: float | None
    e2e_s: float
    finish_reason: str | None
    disk_cached_tokens: int = 0  # of cached_tokens, loaded from the disk tier


@dataclass
class Interval:
    """Sums since the last INFO line."""

    start: float
    busy_s: float = 0.0
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    requests: int = 0
    prompt_seen: int = 0  # prompt tokens of the finished requests, and of those the cache served
    prompt_cached: int = 0
    prompt_from_disk: int = 0  # of prompt_cached, from the disk tier
    disk_read_bytes: int = 0
    disk_write_blocks: int = 0
    disk_write_bytes: int = 0


class StepLog:
    """Collects StepRecords and RequestTraces; hands each to the observers, the trace file and the log."""

    def __init__(self, interval_s: float = 10.0, trace_path: str | None = None):
        self.interval_s = interval_s
        self.step_observers: list[Callable[[StepRecord], None]] = []
        self.request_observers: list[Callable[[RequestTrace], None]] = []
        self.last_step_end: float | None = None
        self.interval = Interval(time.perf_counter())
        path = trace_path if trace_path is not None else os.environ.get(TRACE_ENV)
        self.trace: IO[str] | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def step(self, record: StepRecord) -> None:
        self.last_step_end = record.start + record.duration_s
        i = self.interval
        i.busy_s += record.duration_s
        i.steps += 1
        i.prompt_tokens += record.prefill_tokens
        i.generated_tokens += record.generated_tokens
        i.disk_read_bytes += record.disk_read_bytes
        i.disk_write_blocks += record.disk_write_blocks
        i.disk_write_bytes += record.disk_write_bytes
        for observer in self.step_observers:
            observer(record)
        self.write("step", record)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "step %.1f ms (cpu %.1f, idle before %.1f): %d prefill tokens in %d seqs, %d decode rows",
                record.duration_s * 1e3,
                record.cpu_s * 1e3,
                record.idle_before_s * 1e3,
                record.prefill_tokens,
                record.prefill_seqs,
                record.decode_rows,
            )
        if self.last_step_end - i.start >= self.interval_s:
            self.report(record)

    def request(self, trace: RequestTrace) -> None:
        self.interval.requests += 1
        self.interval.prompt_seen += trace.prompt_tokens
        self.interval.prompt_cached += trace.cached_tokens
        self.interval.prompt_from_disk += trace.disk_cached_tokens
        for observer in self.request_observers:
            observer(trace)
        self.write("request", trace)
        log.debug("request %s", trace)

    def idle_since_last_step(self, now: float) -> float:
        return 0.0 if self.last_step_end is None else now - self.last_step_end

    def report(self, last: StepRecord) -> None:
        i, now = self.interval, self.last_step_end or time.perf_counter()
        span = max(now - i.start, 1e-9)
        hit = f"{100 * i.prompt_cached / i.prompt_seen:.1f} %" if i.prompt_seen else "-"
        if i.prompt_from_disk or i.disk_read_bytes or i.disk_write_blocks:
            hit += (
                f" ({100 * i.prompt_from_disk / max(i.prompt_seen, 1):.1f} % from disk; KV disk: "
                f"{i.disk_read_bytes / 2**20:.0f} MiB read, {i.disk_write_blocks} blocks evicted to it, "
                f"{i.disk_write_bytes / 2**20:.0f} MiB)"
            )
        log.info(
            "engine: %.1f prompt tok/s, %.1f generation tok/s, busy %.0f %%, %d steps, %d running, "
            "%d waiting, prefix cache hit rate %s (%d requests finished)",
            i.prompt_tokens / span,
            i.generated_tokens / span,
            100 * i.busy_s / span,
            i.steps,
            last.num_running,
            last.num_waiting,
            hit,
            i.requests,
        )
        self.interval = Interval(now)

    def write(self, kind: str, record: StepRecord | RequestTrace) -> None:
        if self.trace is not None:
            self.trace.write(json.dumps({"kind": kind, **asdict(record)}) + "\n")
