"""Where each server's machine-cost figures came from (bench/measure/token_cost.py): a line per server
under the per-point table, in the console and the report, so a "-" in the CPU or energy column says why, e.g.
"energy per token: not available here (no /sys/class/powercap)"."""

from __future__ import annotations

from llmopt.bench.rundir import NOT_MEASURED

RAPL = "rapl"


def sources(points: list[dict], field: str) -> str:
    """The distinct values of a source field over `points`, in order, joined."""
    return " / ".join(dict.fromkeys(str(p.get(field) or NOT_MEASURED) for p in points))


def energy_note(points: list[dict]) -> str:
    found = [p for p in points if p.get("energy_source") == RAPL]
    if len(found) == len(points):
        domains = next((p.get("energy_domains") for p in found if p.get("energy_domains")), None)
        return f"energy per token from RAPL ({' + '.join(domains or [])}, the whole machine's)"
    missing = [p for p in points if p.get("energy_source") != RAPL]
    return f"energy per token: not available here ({sources(missing, 'energy_source')})"


def cpu_note(points: list[dict]) -> str:
    if all(p.get("server_cpu_s") is not None for p in points):
        return f"server CPU from {sources(points, 'cpu_source')}"
    missing = [p for p in points if p.get("server_cpu_s") is None]
    return f"server CPU: not available ({sources(missing, 'cpu_source')})"


def cost_source_lines(points: list[dict]) -> list[str]:
    """A line per server of `points`: where its CPU and energy figures came from, or why there are none."""
    by_server: dict[str, list[dict]] = {}
    for p in points:
        by_server.setdefault(p["server"], []).append(p)
    return [f"{server}: {cpu_note(pts)}; {energy_note(pts)}" for server, pts in by_server.items()]
