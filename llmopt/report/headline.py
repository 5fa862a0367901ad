"""The report's first block: for each server config of each run, the answer before the detail: its
best throughput, the highest load that met the SLOs and its p99 TTFT, and the cheapest pricing for the
run's workload."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.bench.schema import PointSummary
from llmopt.cost.from_run import SLO_ATTAINMENT
from llmopt.report.cost_section import CostBlock
from llmopt.report.format import fmt
from llmopt.report.runs import Run, load_value

HEADERS = [
    "run",
    "server",
    "best output throughput (tok/s)",
    "highest load within the SLOs",
    "TTFT p99 there (ms)",
    "cheapest pricing for this workload",
]


@dataclass
class Headline:
    run: str
    server: str
    best: str  # "1,234.5 at concurrency=16"
    slo_load: str  # the load label, or why there is none
    ttft_p99: str
    cheapest: str

    def cells(self) -> list[str]:
        return [self.run, self.server, self.best, self.slo_load, self.ttft_p99, self.cheapest]


def slo_load(points: list[PointSummary]) -> tuple[PointSummary | None, str]:
    """The point with the highest load that met the SLOs (SLO_ATTAINMENT of its requests within every
    one), and its label; without SLOs the busiest point, said so."""
    ok = [p for p in points if p.successful]
    if not any(p.slo for p in ok):
        best = max(ok, key=lambda p: p.request_throughput, default=None)
        return best, f"no SLO set (busiest: {best.load})" if best else "no successful point"
    met = [p for p in ok if p.slo and (p.slo_attainment or 0) >= SLO_ATTAINMENT]
    if not met:
        return None, f"none: no point had {SLO_ATTAINMENT:.0%} of its requests within the SLOs"
    point = max(met, key=load_value)
    return point, point.load


def headline(run: Run, server: str, block: CostBlock | None) -> Headline:
    # A client habit's points (bench/sweep/habit.py) measure the client's choices, not the server config.
    points = [p for p in run.points if p.server == server and not p.habit]
    ok = [p for p in points if p.successful]
    fastest = max(ok, key=lambda p: p.output_throughput, default=None)
    best = f"{fmt(fastest.output_throughput)} at {fastest.load}" if fastest else "-"
    point, label = slo_load(points)
    ttft = fmt(point.ttft_ms.get("p99"), 0) if point else "-"
    cheapest = block.answer[0] if block is not None else "no successful request to price"
    return Headline(run.name, server, best, label, ttft, cheapest)


def headlines(runs: list[Run], blocks: list[CostBlock]) -> list[Headline]:
    """One line per server config of every run, in the order the runs and their points came."""
    by_key = {(b.run, b.server): b for b in blocks}
    out = []
    for run in runs:
        for server in dict.fromkeys(p.server for p in run.points):
            out.append(headline(run, server, by_key.get((run.name, server))))
    return out
