"""The report's client-habits section: for each habit of a run (a recipe's [[habit]], bench/sweep/habit.py),
what its one change did to TTFT, E2E and throughput against the baseline point of the same run."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.bench.schema import PointSummary
from llmopt.report.format import fmt
from llmopt.report.runs import Run

HEADERS = [
    "server",
    "in (tokens)",
    "out (tokens)",
    "baseline load",
    "setting",
    "baseline",
    "habit",
    "Δ TTFT p50 (%)",
    "Δ TTFT p99 (%)",
    "Δ E2E p50 (%)",
    "Δ output tok/s (%)",
]
# (summary field, statistic or None, whether higher is better) of each Δ column, in HEADERS' order.
DELTAS = [("ttft_ms", "median", False), ("ttft_ms", "p99", False), ("e2e_ms", "median", False)]
DELTAS.append(("output_throughput", None, True))


@dataclass
class Cell:
    text: str
    cls: str = ""  # "better" or "worse" for a change, "" otherwise


@dataclass
class HabitTable:
    run: str
    habit: str
    rows: list[list[Cell]]


def change(
    habit: PointSummary, base: PointSummary, field: str, stat: str | None, higher_is_better: bool
) -> Cell:
    """The habit point's `field` against the baseline's, in %: green where it is better."""
    new, old = habit.figure(field, stat), base.figure(field, stat)
    if new is None or not old:
        return Cell("-")
    percent = (new - old) / old * 100
    better = percent > 0 if higher_is_better else percent < 0
    return Cell(f"{percent:+.1f}", "better" if better else "worse" if percent else "")


def setting_text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return fmt(value, 2) if isinstance(value, float) else str(value)


def habit_rows(point: PointSummary, base: PointSummary) -> list[list[Cell]]:
    """One row per setting the habit changed (the Δ columns on the first)."""
    deltas = [change(point, base, *d) for d in DELTAS]
    rows = []
    for i, (setting, (before, after)) in enumerate((point.habit_changes or {}).items()):
        where = [base.server, str(base.prompt_len), str(base.output_len), base.load]
        cells = [Cell(text) for text in (*where, setting, setting_text(before), setting_text(after))]
        rows.append(cells + (deltas if i == 0 else [Cell("") for _ in deltas]))
    return rows


def habit_tables(runs: list[Run]) -> list[HabitTable]:
    """A table per habit of each run, a row per baseline point it was compared with."""
    tables = []
    for run in runs:
        by_key = {p.key: p for p in run.points}
        by_habit: dict[str, list[list[Cell]]] = {}
        for p in run.points:
            base = by_key.get(p.baseline_key)
            if p.habit and base is not None:
                by_habit.setdefault(p.habit, []).extend(habit_rows(p, base))
        tables += [HabitTable(run.name, habit, rows) for habit, rows in by_habit.items()]
    return tables
