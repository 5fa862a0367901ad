"""The report's client-habits section: a table per habit with the setting it changed and its change in
TTFT, E2E and output throughput against the baseline point of the same run; rendered in headless
Chromium. Synthetic run folders whose latencies are known: no model, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.report.client_habits import HEADERS, habit_tables
from llmopt.report.headline import headlines
from llmopt.report.html import write_report
from llmopt.report.runs import load_run
from tests.report.browser import needs_chromium, render
from tests.run_folders import FakePoint, write_run

BASE_KEY = "local|prompt=100|output=10|concurrency=1"


def habit_point(name: str, changes: dict, ttft_s: float, wall_s: float, concurrency: int) -> FakePoint:
    extra = {"habit": name, "habit_changes": changes, "baseline_key": BASE_KEY}
    extra["load"] = f"concurrency=1,habit={name}"
    return FakePoint(20, ttft_s, wall_s, concurrency=concurrency, noise=0.0, extra=extra)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    points = [
        FakePoint(20, 0.10, 10.0, noise=0.0),  # TTFT 100 ms, E2E 190 ms, 20 output tok/s
        habit_point("bursty", {"burstiness": [1.0, 0.25]}, 0.20, 20.0, 2),  # slower on all counts
        habit_point("no-stream", {"stream": [True, False]}, 0.05, 8.0, 3),  # faster on all counts
    ]
    return write_run(tmp_path_factory.mktemp("habits") / "habits", points)


def test_a_table_per_habit_against_its_baseline(run_dir):
    bursty, no_stream = habit_tables([load_run(run_dir)])
    assert (bursty.habit, no_stream.habit) == ("bursty", "no-stream")
    [row] = bursty.rows
    cells = dict(zip(HEADERS, row))
    assert [cells[h].text for h in ("baseline load", "setting", "baseline", "habit")] == [
        *("concurrency=1", "burstiness", "1.00", "0.25")
    ]
    # TTFT 100 -> 200 ms, E2E 190 -> 290 ms, 20 -> 10 output tok/s
    assert cells["Δ TTFT p50 (%)"].text == "+100.0" and cells["Δ TTFT p50 (%)"].cls == "worse"
    assert cells["Δ E2E p50 (%)"].text == "+52.6" and cells["Δ output tok/s (%)"].text == "-50.0"
    cells = dict(zip(HEADERS, no_stream.rows[0]))
    assert [cells[h].text for h in ("baseline", "habit")] == ["on", "off"]
    assert cells["Δ TTFT p50 (%)"].text == "-50.0" and cells["Δ TTFT p50 (%)"].cls == "better"
    assert cells["Δ output tok/s (%)"].text == "+25.0" and cells["Δ output tok/s (%)"].cls == "better"


@pytest.mark.slow
def test_the_report_has_the_section_only_for_a_run_with_habits(run_dir, tmp_path):
    html = write_report([run_dir], tmp_path / "r.html").read_text()
    assert "<h2>Client habits</h2>" in html and "habits: bursty" in html and "+100.0" in html
    plain = write_run(tmp_path / "plain", [FakePoint(5)])
    assert "Client habits" not in write_report([plain], tmp_path / "p.html").read_text()


def test_the_headline_leaves_habit_points_out(run_dir):
    # The no-stream habit's 25 tok/s is the client's doing, not the server config's best.
    [headline] = headlines([load_run(run_dir)], [])
    assert headline.best == "20.0 at concurrency=1"


@needs_chromium
@pytest.mark.slow
def test_the_habits_report_renders_in_headless_chromium(run_dir, tmp_path):
    page = render(write_report([run_dir], tmp_path / "report.html"))
    assert page.errors == [] and all(url.startswith(("file:", "data:")) for url in page.requests)
    assert all(ok for _, ok in page.images), page.images
