"""The goodput search's rule: which load to probe next from the probes so far (doubling until one misses
the SLOs, then bisection), whether a probe met them, and the answer. Settings (bench_config.py) make one and
search.py drives it over a sweep's lengths; it imports neither."""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

from llmopt.bench.schema import PointSummary, SearchProbe


@dataclass
class GoodputSearch:
    slo: dict[str, float]  # {"ttft": 0.5, ...} in seconds (slo.py: parse_slo)
    start: float  # the first probe's load
    integer: bool  # concurrency and sessions are whole numbers
    percentile: float = 90.0
    tolerance: float = 0.1  # rates: stop once the bracket is narrower than this share of its low end
    max_probes: int = 16

    def meets(self, summary: PointSummary) -> bool:
        """Whether a probe's point met every SLO at the percentile (a failed request misses them all)."""
        if summary.failed or not summary.successful:
            return False
        for name, limit in self.slo.items():
            value = summary.figure(f"{name}_ms", f"p{self.percentile:g}")
            if value is None or value > limit * 1000:
                return False
        return True

    def next_load(self, history: list[tuple[float, bool]]) -> float | None:
        """The next probe's load after the (load, met the SLOs) probes so far; None when done."""
        if not history:
            return self.start
        if len(history) >= self.max_probes:
            return None
        missed = [load for load, ok in history if not ok]
        if not missed:
            return history[-1][0] * 2
        high = min(missed)
        low = max((load for load, ok in history if ok and load < high), default=None)
        if low is None:  # even the first probe missed: halve below the lowest miss
            load = math.floor(high / 2) if self.integer else high / 2
            return load if load >= (1 if self.integer else self.start / 64) else None
        if self.integer:
            return (low + high) // 2 if high - low > 1 else None
        return (low + high) / 2 if high - low > self.tolerance * low else None

    @staticmethod
    def answer(history: list[tuple[float, bool]]) -> float | None:
        """The highest load that met the SLOs below every load that missed them."""
        missed = min((load for load, ok in history if not ok), default=math.inf)
        return max((load for load, ok in history if ok and load < missed), default=None)


@dataclass
class SearchResult:
    probes: list[PointSummary]  # the probes' point summaries, in the order they ran
    answer: float | None  # None: no probe met the SLOs (or the search did not finish)
    finished: bool


def run_search(search: GoodputSearch) -> Generator[float, PointSummary | None, SearchResult]:
    """Probe until done: yields each probe's load and is sent back that probe's point summary (None: it
    cannot be measured now, and the search stops unfinished); returns the result. The caller measures,
    so a probe is kept in the run before the next is chosen. Each summary gets a `search` block: its
    probe number, whether it met the SLOs, and whether its load is the answer."""
    history: list[tuple[float, bool]] = []
    probes: list[PointSummary] = []
    while (load := search.next_load(history)) is not None:
        summary = yield load
        if summary is None:
            return SearchResult(probes, None, False)
        ok = search.meets(summary)
        summary.search = SearchProbe(len(history), load, ok, False)
        history.append((load, ok))
        probes.append(summary)
    answer = search.answer(history)
    for summary in probes:
        summary.search.answer = summary.search.load == answer
    return SearchResult(probes, answer, True)
