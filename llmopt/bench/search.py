"""The goodput search: the highest load (concurrency, request rate, sessions or session rate) at which
every SLO holds at a percentile, found by doubling from the first load until a probe misses, then by
bisection between the highest probe that met the SLOs and the lowest that missed, to a tolerance
(integer loads: until they are 1 apart). Every probe is an ordinary load point of the run: run_searches
drives the search for each prompt and output length of a sweep."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmopt.bench.client import Target
from llmopt.bench.matrix import point_key
from llmopt.bench.point_summary import run_cell

if TYPE_CHECKING:
    from llmopt.bench.config import ServerSpec
    from llmopt.bench.sweep import Sweep


@dataclass
class GoodputSearch:
    slo: dict[str, float]  # {"ttft": 0.5, ...} in seconds (request_metrics.parse_slo)
    start: float  # the first probe's load
    integer: bool  # concurrency and sessions are whole numbers
    percentile: float = 90.0
    tolerance: float = 0.1  # rates: stop once the bracket is narrower than this share of its low end
    max_probes: int = 16

    def meets(self, summary: dict) -> bool:
        """Whether a probe's point met every SLO at the percentile (a failed request misses them all)."""
        if summary["failed"] or not summary["successful"]:
            return False
        for name, limit in self.slo.items():
            value = summary[f"{name}_ms"].get(f"p{self.percentile:g}")
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
    probes: list[dict]  # the probes' point summaries, in the order they ran
    answer: float | None  # None: no probe met the SLOs (or the search did not finish)
    finished: bool


def run_search(search: GoodputSearch, measure: Callable[[float, int], dict | None]) -> SearchResult:
    """Probe until done. `measure(load, probe number)` gives the point summary of that probe (None:
    it cannot be measured now, and the search stops unfinished). Each summary gets a "search" entry:
    its probe number, whether it met the SLOs, and whether its load is the answer."""
    history: list[tuple[float, bool]] = []
    probes: list[dict] = []
    while (load := search.next_load(history)) is not None:
        summary = measure(load, len(history))
        if summary is None:
            return SearchResult(probes, None, False)
        ok = search.meets(summary)
        summary["search"] = {"probe": len(history), "load": load, "meets_slo": ok, "answer": False}
        history.append((load, ok))
        probes.append(summary)
    answer = search.answer(history)
    for summary in probes:
        summary["search"]["answer"] = summary["search"]["load"] == answer
    return SearchResult(probes, answer, True)


def run_searches(sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None) -> None:
    """The goodput search for each prompt and output length: every probe a point of the run; the
    answers go into the run's settings ("search") and each probe's summary says if it is the answer."""
    config = sweep.config
    done = {p["key"]: p for p in sweep.points}
    for number, (prompt_len, output_len) in enumerate(
        itertools.product(config.prompt_lens, config.output_lens)
    ):

        def measure(
            load: float, probe: int, prompt_len=prompt_len, output_len=output_len, number=number
        ) -> dict:
            cell = (prompt_len, output_len, config.search_point(load))
            key = point_key(server_name, *cell)
            if key in done:
                return done[key]
            summary = run_cell(sweep, target, server_name, spec, 1000 * number + probe, cell)
            sweep.finish_point(summary)
            return summary

        result = run_search(config.search(), measure)
        answer = next((p for p in result.probes if p["search"]["answer"]), None)
        sweep.settings.setdefault("search", []).append(
            {
                "server": server_name,
                "prompt_len": prompt_len,
                "output_len": output_len,
                "slo": config.goodput_search,
                "percentile": config.search_percentile,
                "answer": result.answer,
                "answer_key": answer["key"] if answer else None,
                "probes": [p["key"] for p in result.probes],
            }
        )
        sweep.run.write_summaries(sweep.points, sweep.settings)
