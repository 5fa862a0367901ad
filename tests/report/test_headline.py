"""The report reads as a decision: the headline first (best throughput, highest load within the SLOs and
its p99 TTFT, the cheapest pricing), units in the headers, a cost section priced from the run's own
requests, per conversation for a multi-turn run; and it renders offline in headless Chromium with every
image decoded. Synthetic run folders: no model, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.report.headline import headlines
from llmopt.report.html import POINT_HEADERS, write_report
from llmopt.report.runs import load_run
from tests.report.browser import needs_chromium, render
from tests.run_folders import FakePoint, write_run


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("headline")
    sweep = [
        FakePoint(20, 0.10, 10.0, concurrency=1),  # 2 req/s, TTFT 100 ms
        FakePoint(20, 0.30, 5.0, concurrency=4, seed=1),  # 4 req/s, TTFT 300 ms
        FakePoint(20, 0.90, 4.0, concurrency=16, seed=2),  # 5 req/s, TTFT 900 ms: over the SLO
    ]
    single = write_run(base / "sweep", sweep, slo="ttft=500ms")
    agent = write_run(base / "agent", [FakePoint(24, 0.2, 12.0, 800, 120, cached_tokens=500, turns=6)])
    return [single, agent]


@pytest.mark.slow
def test_the_headline_answers_first(run_dirs, tmp_path):
    [sweep, agent] = headlines([load_run(d) for d in run_dirs], [])
    assert sweep.best == "50.0 at concurrency=16"  # 20 * 10 output tokens in 4 s
    assert sweep.slo_load == "concurrency=4" and sweep.ttft_p99.replace(",", "").isdigit()
    assert 280 <= int(sweep.ttft_p99) <= 320
    assert agent.slo_load.startswith("no SLO set")
    html = write_report(run_dirs, tmp_path / "r.html").read_text()
    assert html.index("Headline") < html.index("Run settings") < html.index("Cost")
    assert "is the cheapest that serves every request" in html[: html.index("Run settings")]


def test_units_in_the_report_headers():
    assert (
        "TTFT p99 (ms)" in POINT_HEADERS
        and "in (tokens)" in POINT_HEADERS
        and "goodput (req/s)" in POINT_HEADERS
    )


@pytest.mark.slow
def test_the_cost_section_prices_conversations(run_dirs, tmp_path):
    html = write_report(run_dirs, tmp_path / "r.html").read_text()
    assert "agent / local: 24 requests in 4 conversations" in html
    assert "$ / conversation" in html and "cost per conversation against turns" in html
    assert "Break-even at 800 new prompt + 120 output tokens per turn" in html
    # Oxlo Free caps prompts at 8K: turn 6 sends 6 * 800 + 5 * 120 = 5,400 tokens, so it serves every
    # turn, and costs nothing: named apart from the cheapest paid pricing
    assert "oxlo/free would cost nothing within its daily quota" in html


# CI sets LLMOPT_REQUIRE_BROWSER: there a missing browser fails the test instead of skipping it.
@needs_chromium
@pytest.mark.slow
def test_the_report_renders_in_headless_chromium(run_dirs, tmp_path):
    page = render(write_report(run_dirs, tmp_path / "report.html"))
    assert page.errors == []
    assert all(url.startswith(("file:", "data:")) for url in page.requests), page.requests
    assert page.first_heading == "Headline"
    assert all(ok for _, ok in page.images), page.images
    titles = [alt for alt, _ in page.images]
    assert sum("cost per conversation against turns" in t for t in titles) == 2  # one per run
    assert any(t.startswith("Per-request timeline") for t in titles)
