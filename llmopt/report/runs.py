"""A bench run as the report reads it: its settings, point summaries and request records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmopt.bench.rundir import SUMMARY_JSON, RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, RunSettings


@dataclass
class Run:
    name: str
    path: Path
    settings: RunSettings
    points: list[PointSummary]
    records: list[RequestRecord]

    def series(self) -> dict[tuple[str, int, int], list[PointSummary]]:
        """Points grouped by (server, prompt length, output length), each group ordered by load."""
        groups: dict[tuple[str, int, int], list[PointSummary]] = {}
        for p in self.points:
            # Points not streamed are a series of their own (a sweep may try both), as is each habit's.
            server = p.server if p.stream else p.server + " no-stream"
            if p.habit:
                server = f"{p.server} habit {p.habit}"
            groups.setdefault((server, p.prompt_len, p.output_len), []).append(p)
        for group in groups.values():
            group.sort(key=lambda p: (p.concurrency or 0, p.request_rate or 0, load_value(p)))
        return groups

    def records_of(self, key: str) -> list[RequestRecord]:
        return [r for r in self.records if r.point == key and r.success]


def load_run(path: Path) -> Run:
    run = RunDir(path)
    if not run.is_run():
        raise ValueError(f"{path} is not a bench run (no {SUMMARY_JSON})")
    summary = run.read_summary()
    return Run(path.name, path, summary.settings, summary.points, run.read_records())


def load_value(point: PointSummary) -> float:
    """The x of a load point: its concurrency, request rate, sessions at once, session rate or replay
    speed."""
    loads = (point.concurrency, point.request_rate, point.sessions, point.session_rate, point.replay_speed)
    for load in loads:
        if load is not None:
            return load
    raise ValueError(f"point {point.key} has no load")
