"""The goodput search: the highest load (concurrency, request rate, sessions or session rate) at which
every SLO holds at a percentile, found by doubling from the first load until a probe misses, then by
bisection between the highest probe that met the SLOs and the lowest that missed, to a tolerance
(integer loads: until they are 1 apart). Every probe is an ordinary load point of the run: run_searches
drives the search for each prompt and output length of a sweep."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmopt.bench.load.client import Target
from llmopt.bench.schema import GoodputAnswer, PointSummary
from llmopt.bench.sweep.goodput_search import SearchResult, run_search
from llmopt.bench.sweep.matrix import point_key
from llmopt.bench.sweep.point_summary import run_cell

if TYPE_CHECKING:
    from llmopt.bench.servers.server_spec import ServerSpec
    from llmopt.bench.sweep.sweep_state import Sweep


@dataclass
class SearchAnswer:
    """One length's search finished: its entry of the run's settings (`search`)."""

    entry: GoodputAnswer


def run_searches(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None
) -> Iterator[PointSummary | SearchAnswer]:
    """The goodput search for each prompt and output length, every probe a point of the run. Yields
    each probe it measured as it finishes (the sweep keeps it in the run before the next probe runs),
    and each length's answer (the sweep records it in the run's settings); each probe's summary says
    whether it is the answer."""
    config = sweep.config
    done = {p.key: p for p in sweep.points}
    lengths = itertools.product(config.workload.prompt_lens, config.workload.output_lens)
    for number, (prompt_len, output_len) in enumerate(lengths):
        cells = (server_name, spec, number, prompt_len, output_len)
        result = yield from search_length(sweep, target, cells, done)
        answer = next((p for p in result.probes if p.search.answer), None)
        entry = GoodputAnswer(
            server=server_name,
            prompt_len=prompt_len,
            output_len=output_len,
            slo=config.load.goodput_search,
            percentile=config.load.search_percentile,
            answer=result.answer,
            answer_key=answer.key if answer else None,
            probes=[p.key for p in result.probes],
        )
        yield SearchAnswer(entry)


def search_length(
    sweep: Sweep, target: Target, cells: tuple, done: dict[str, PointSummary]
) -> Generator[PointSummary, None, SearchResult]:
    """One length's search: each probe's point measured (or, resumed, read from the run's finished
    points) and, when measured here, yielded; returns the search's result."""
    server_name, spec, number, prompt_len, output_len = cells
    probes = run_search(sweep.config.search())
    load, probe = next(probes), 0
    while True:
        cell = (prompt_len, output_len, sweep.config.search_point(load))
        summary = done.get(point_key(server_name, *cell))
        if summary is None:
            summary = run_cell(sweep, target, server_name, spec, 1000 * number + probe, cell)
            yield summary
        try:
            load, probe = probes.send(summary), probe + 1
        except StopIteration as finished:
            return finished.value
