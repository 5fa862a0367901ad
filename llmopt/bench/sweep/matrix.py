"""A server's matrix: the points a sweep runs on each server config, the baseline's cells (prompt length
x output length x load point) and each client habit's change to them, and the key that names a point in
a run (what --resume matches finished points by). A point's place in the matrix seeds its prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.sweep.habit import Habit

if TYPE_CHECKING:
    from llmopt.bench.sweep.bench_config import BenchConfig

# (prompt length, output length, load point): one point of a server's matrix
Cell = tuple[int, int, LoadPoint]


@dataclass
class MatrixEntry:
    """A point of a server's matrix: a baseline cell, or a habit's change to one (`base`)."""

    cell: Cell
    habit: Habit | None = None
    base: Cell | None = None


def matrix(config: BenchConfig) -> list[MatrixEntry]:
    """The baseline's cells (prompt x output length x load point), then each habit's: every baseline
    cell it applies to, with its one change (the baseline's places, and so its seeds, stay as they were)."""
    base: list[Cell] = [
        (pl, ol, lp)
        for pl in config.workload.prompt_lens
        for ol in config.workload.output_lens
        for lp in config.load_points()
    ]
    entries = [MatrixEntry(cell) for cell in base]
    for habit in config.habits:
        entries += [
            MatrixEntry((pl, ol, habit.point(lp)), habit, (pl, ol, lp))
            for pl, ol, lp in base
            if habit.applies_to(lp)
        ]
    return entries


def habit_fields(config: BenchConfig, server_name: str, entry: MatrixEntry) -> dict:
    """What a habit point's summary says of its habit: its name, what it changed from what, and the
    baseline point it is compared with (report/client_habits.py)."""
    assert entry.habit is not None and entry.base is not None
    return {
        "habit": entry.habit.name,
        "habit_changes": entry.habit.changes(config, entry.base[2]),
        "baseline_key": point_key(server_name, *entry.base),
    }


def point_key(server: str, prompt_len: int, output_len: int, point: LoadPoint) -> str:
    """A point's identity in a run: what --resume matches finished points by."""
    return f"{server}|prompt={prompt_len}|output={output_len}|{point.label}"
