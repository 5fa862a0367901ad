"""The server's own view of a load point: its /metrics page scraped every `interval_s` while the point
runs (running and waiting requests, KV cache use, prefix-cache, preemption and speculation counters), so
a report can show why a point was slow. Read over HTTP with server_stats.py (the bench never imports the
server), with the names of whichever engine serves the page, llmopt's, vLLM's, llama.cpp's or SGLang's,
into one set of figures (metric_names.py). A server without the page is not sampled, and nothing is
said: most paid APIs have none.

The scraping runs in a thread of its own, not in the point's event loop, whose timing it would disturb."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, fields

import httpx

from llmopt.bench.observe.metric_names import read_figures
from llmopt.bench.observe.server_stats import scrape


@dataclass
class ServerSample:
    """One scrape. `t`: seconds since the point's start (its first request; the warm-up is before 0).
    Counters are the server's running totals; the rates and counts are over the interval since the
    sample before. `engine`: whose metric names the page had."""

    t: float
    engine: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_blocks_used: float | None = None
    kv_cache_usage: float | None = None  # fraction of the KV cache in use, 0-1
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    prefix_cache_hit_rate: float | None = None  # hits / queries of prompt tokens in the interval
    preemptions_total: float | None = None
    preemptions: float | None = None  # requests preempted in the interval
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_acceptance: float | None = None  # accepted / proposed tokens in the interval

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict) -> ServerSample:
        """A sample as to_json wrote it and the run folder reads it back (an earlier run's under today's
        names: rundir.py), keys it does not know left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_sample(values: dict[str, float], t: float) -> ServerSample | None:
    """The figures of a parsed /metrics page; None when it has none of them (not a serving engine's)."""
    read = read_figures(values)
    if read is None:
        return None
    engine, figures = read
    return ServerSample(t, engine, **figures)


def interval_rate(num: str, den: str, before: ServerSample, after: ServerSample) -> float | None:
    """Growth of counter `num` over growth of counter `den` between two samples; None without growth."""
    values = [getattr(s, f) for s in (before, after) for f in (num, den)]
    if any(v is None for v in values):
        return None
    num_before, den_before, num_after, den_after = values
    grown = den_after - den_before
    return (num_after - num_before) / grown if grown > 0 else None


def growth(counter: str, before: ServerSample, after: ServerSample) -> float | None:
    """How much counter `counter` grew between two samples; None where either lacks it."""
    a, b = getattr(before, counter), getattr(after, counter)
    return None if a is None or b is None else b - a


def with_rates(samples: list[ServerSample]) -> list[ServerSample]:
    """`samples` with each one's prefix-cache hit rate, preemptions and speculation acceptance over its
    interval."""
    for before, after in zip(samples, samples[1:]):
        after.prefix_cache_hit_rate = interval_rate("prefix_hits", "prefix_queries", before, after)
        after.preemptions = growth("preemptions_total", before, after)
        after.spec_acceptance = interval_rate("spec_accepted_tokens", "spec_draft_tokens", before, after)
    return samples


class MetricsSampler:
    """`with MetricsSampler(url, 0.5) as s:` scrapes `url`/metrics every 0.5 s until the block ends (and
    once more then); `s.samples(origin)` gives them with times since `origin` (a time.perf_counter()
    value). Interval 0, or a server whose first scrape finds no figures, samples nothing."""

    def __init__(self, base_url: str, interval_s: float, timeout_s: float = 5.0):
        assert interval_s >= 0
        self.base_url, self.interval_s, self.timeout_s = base_url, interval_s, timeout_s
        self._scrapes: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None

    def __enter__(self) -> MetricsSampler:
        if not self.interval_s:
            return self
        self._client = httpx.Client(timeout=self.timeout_s)
        if self._scrape_once():
            self._thread = threading.Thread(target=self._loop, name="server-metrics", daemon=True)
            self._thread.start()
        else:
            self._close()
        return self

    def __exit__(self, kind, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if kind is None:  # an interrupted point is run again: its samples are not kept
                self._scrape_once()  # the counters' final values, after the last request ended
        self._close()

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _scrape_once(self) -> bool:
        now = time.perf_counter()
        values = scrape(self.base_url, self.timeout_s, self._client)
        if values and read_sample(values, 0.0) is not None:
            self._scrapes.append((now, values))
            return True
        return False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._scrape_once()

    def samples(self, origin: float) -> list[ServerSample]:
        samples = [read_sample(values, round(at - origin, 4)) for at, values in self._scrapes]
        return with_rates([s for s in samples if s is not None])


def summarize_samples(runs: list[tuple[list[ServerSample], float]]) -> dict | None:
    """A point's server figures from the (samples, wall seconds) of each of its runs: gauges over the
    samples taken while a run sent (0 <= t <= wall), counters' growth and rates from a run's first
    sample at or after 0 to its last (taken after its last request), summed over the runs. A figure the
    server does not publish is None. None without samples."""
    runs = [(samples, wall) for samples, wall in runs if samples]
    if not runs:
        return None
    during = [s for samples, wall in runs for s in samples if 0 <= s.t <= wall]
    during = during or [s for samples, _ in runs for s in samples]

    def values(field: str) -> list[float]:
        return [getattr(s, field) for s in during if getattr(s, field) is not None]

    def mean(field: str) -> float | None:
        found = values(field)
        return sum(found) / len(found) if found else None

    return {
        "samples": sum(len(samples) for samples, _ in runs),
        "engine": next((s.engine for samples, _ in runs for s in samples if s.engine), None),
        "running_mean": mean("running"),
        "running_max": max(values("running"), default=None),
        "waiting_mean": mean("waiting"),
        "waiting_max": max(values("waiting"), default=None),
        "kv_cache_usage_mean": mean("kv_cache_usage"),
        "kv_cache_usage_max": max(values("kv_cache_usage"), default=None),
        "prefix_cache_hit_rate": pooled_rate("prefix_hits", "prefix_queries", runs),
        "preemptions": pooled_growth("preemptions_total", runs),
        "spec_acceptance": pooled_rate("spec_accepted_tokens", "spec_draft_tokens", runs),
    }


def run_growth(counter: str, samples: list[ServerSample]) -> float | None:
    """How much `counter` grew over one run: from its first sample at or after its start to its last."""
    measured = [s for s in samples if s.t >= 0]
    first, last = (measured[0], measured[-1]) if len(measured) > 1 else (samples[0], samples[-1])
    return growth(counter, first, last)


def pooled_growth(counter: str, runs: list[tuple[list[ServerSample], float]]) -> float | None:
    """`counter`'s growth summed over the runs; None when no run's samples had it."""
    grown = [g for samples, _ in runs if (g := run_growth(counter, samples)) is not None]
    return sum(grown) if grown else None


def pooled_rate(num: str, den: str, runs: list[tuple[list[ServerSample], float]]) -> float | None:
    """Counter `num`'s growth over counter `den`'s across the runs; None when `den` did not grow."""
    num_grown, den_grown = pooled_growth(num, runs), pooled_growth(den, runs)
    if num_grown is None or not den_grown or den_grown <= 0:
        return None
    return num_grown / den_grown
