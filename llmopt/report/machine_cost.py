"""Where each server's machine-cost figures came from (bench/measure/token_cost.py): a line per server
under the per-point table, in the console and the report, so a "-" in the CPU or energy column says why, e.g.
"energy per token: not available here (no /sys/class/powercap)"."""

from __future__ import annotations

from llmopt.bench.rundir import NOT_MEASURED
from llmopt.bench.schema import PointSummary

RAPL = "rapl"


def sources(found: list[str | None]) -> str:
    """The distinct sources of a figure over some points, in order, joined."""
    return " / ".join(dict.fromkeys(str(source or NOT_MEASURED) for source in found))


def energy_note(points: list[PointSummary]) -> str:
    found = [p for p in points if p.energy_source == RAPL]
    if len(found) == len(points):
        domains = next((p.energy_domains for p in found if p.energy_domains), None)
        return f"energy per token from RAPL ({' + '.join(domains or [])}, the whole machine's)"
    missing = [p.energy_source for p in points if p.energy_source != RAPL]
    return f"energy per token: not available here ({sources(missing)})"


def cpu_note(points: list[PointSummary]) -> str:
    if all(p.server_cpu_s is not None for p in points):
        return f"server CPU from {sources([p.cpu_source for p in points])}"
    missing = [p.cpu_source for p in points if p.server_cpu_s is None]
    return f"server CPU: not available ({sources(missing)})"


def cost_source_lines(points: list[PointSummary]) -> list[str]:
    """A line per server of `points`: where its CPU and energy figures came from, or why there are none."""
    by_server: dict[str, list[PointSummary]] = {}
    for p in points:
        by_server.setdefault(p.server, []).append(p)
    return [f"{server}: {cpu_note(pts)}; {energy_note(pts)}" for server, pts in by_server.items()]
