"""The notes under a run's table of points: the steady state its latency and throughput figures are over
(bench/measure/steady_state.py), each point that saturated with what showed it (bench/load/saturation.py),
and each point --stop-on-saturation skipped. Runs written before the bench measured these get none."""

from __future__ import annotations

from llmopt.bench.schema import PointSummary
from llmopt.report.runs import Run


def steady_note(points: list[PointSummary]) -> str | None:
    blocks = [p.steady_state for p in points if p.steady_state]
    if not blocks:
        return None
    cut = sum(1 for b in blocks if b.applied)
    return (
        f"Latency and throughput figures are over each point's steady state ({blocks[0].rule}); "
        f"{cut} of {len(blocks)} point(s) cut, the 'steady state' column counting the requests whose "
        "latencies count. Request counts, token totals and goodput count every request."
    )


def point_notes(run: Run) -> list[str]:
    notes = [note] if (note := steady_note(run.points)) else []
    for p in run.points:
        if p.saturated:
            notes.append(
                f"Saturated: {p.key}: {p.saturation_reason}. Its requests came faster than the server "
                "completed them: its figures are of a growing queue, not of the server at that load."
            )
    for skipped in run.settings.skipped or []:
        notes.append(f"Skipped (--stop-on-saturation): {skipped.key}: {skipped.reason}.")
    return notes
