"""The goodput search: the highest load (concurrency, request rate, sessions or session rate) at which
every SLO holds at a percentile, found by doubling from the first load until a probe misses, then by
bisection between the highest probe that met the SLOs and the lowest that missed, to a tolerance
(integer loads: until they are 1 apart). Every probe is an ordinary load point of the run: run_searches
drives the search for each prompt and output length of a sweep."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from llmopt.bench.load.client import Target
from llmopt.bench.sweep.goodput_search import run_search
from llmopt.bench.sweep.matrix import point_key
from llmopt.bench.sweep.point_summary import run_cell

if TYPE_CHECKING:
    from llmopt.bench.servers.server_spec import ServerSpec
    from llmopt.bench.sweep.sweep_state import Sweep


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
