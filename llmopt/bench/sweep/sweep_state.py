"""What every point of a run shares: its settings, its run folder and the summaries so far, as plain data.
The sweep makes one and hands it down to rounds.py, search.py and the point's runs and summary, which
read it and return what they finished (the sweep keeps it); it lives apart from sweep.py so that none of
those imports the module that imports them (no import circle)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary, RunSettings
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.matrix import MatrixEntry

# on_point_start(key, point) returns the callback that sees each of the point's finished records.
PointStart = Callable[[str, LoadPoint], Callable]


@dataclass
class Sweep:
    """What every point of a run shares."""

    config: BenchConfig
    run: RunDir
    tokenizer: object
    settings: RunSettings
    slo: dict[str, float]
    records_out: IO[str]
    points: list[PointSummary]  # every finished point of the run, old and new, in order
    done_keys: set[str]  # the points finished before this session (on resume)
    # The CLI's progress for a point's records: the one hook handed down (point_runs.py calls it as a
    # point starts); what finished comes back up as return values (rounds.py, search.py).
    on_point_start: PointStart | None = None

    def for_entry(self, entry: MatrixEntry) -> Sweep:
        """What a matrix entry runs with: a habit's points with its settings (prompt length spread,
        connection reuse), the others with the run's."""
        if entry.habit is None:
            return self
        return dataclasses.replace(self, config=self.config.habit_config(entry.habit))
