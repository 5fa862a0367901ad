"""The notes under a run's point table: the steady-state rule, each saturated point with its reason, each
point --stop-on-saturation skipped; none for a run written before the bench measured them."""

from __future__ import annotations

from pathlib import Path

from llmopt.bench.measure.steady_state import RULE
from llmopt.bench.schema import PointSummary, RunSettings
from llmopt.report.html import render
from llmopt.report.point_notes import point_notes
from llmopt.report.runs import Run, load_run
from tests.run_folders import FakePoint, write_run

STEADY = {
    "rule": RULE,
    "applied": True,
    "kept": 32,
    "of": 40,
    "throughput_requests": 30,
    "throughput_span_s": 15,
}
REASON = "TTFT 500 ms early (p10) -> 9,000 ms late (median); 3.5 -> 18.1 requests in flight"


def run_of(points: list[dict], settings: dict | None = None) -> Run:
    summaries = [PointSummary.from_json(p) for p in points]
    return Run("r", Path("r"), RunSettings.from_json(settings or {}), summaries, [])


def test_the_notes_state_the_rule_each_saturated_point_and_each_skipped_one():
    points = [
        {"key": "s|rate=2/s", "steady_state": STEADY, "saturated": False, "saturation_reason": None},
        {
            "key": "s|rate=4/s",
            "steady_state": {**STEADY, "applied": False},
            "saturated": True,
            "saturation_reason": REASON,
        },
    ]
    skipped = {"skipped": [{"key": "s|rate=8/s", "reason": "rate=4/s saturated (...)"}]}
    steady, saturated, skip = point_notes(run_of(points, skipped))
    assert RULE in steady and "1 of 2 point(s) cut" in steady
    assert saturated.startswith(f"Saturated: s|rate=4/s: {REASON}.")
    assert skip == "Skipped (--stop-on-saturation): s|rate=8/s: rate=4/s saturated (...)."


def test_a_run_from_before_gets_no_notes():
    assert point_notes(run_of([{"key": "s|concurrency=1", "ttft_ms": {}}])) == []


def test_the_report_shows_the_notes_and_the_columns(tmp_path):
    extra = {"steady_state": STEADY, "saturated": True, "saturation_reason": REASON}
    path = write_run(tmp_path / "run", [FakePoint(requests=40, extra=extra)])
    html = render([load_run(path)], None)
    assert "steady state (requests)" in html and "<th>saturated</th>" in html
    assert "<td>yes</td>" in html and "<td>32</td>" in html
    assert f"Saturated: {FakePoint().key}: {REASON}" in html.replace("&gt;", ">")
    assert "each point&#39;s steady state" in html
