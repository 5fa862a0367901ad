"""The report as a person sees it: rendered in a real headless Chromium, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import API_KEY
from tests.report.browser import needs_chromium, render

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory) -> list[Path]:
    """Two small real bench runs against the live server (the second with more load points)."""
    base = tmp_path_factory.mktemp("runs")
    paths = []
    for name, conc in (("first", "1,2"), ("second", "1,2,4")):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmopt.cli",
                "bench",
                "--endpoint",
                server.url + "/v1",
                "--api-key",
                API_KEY,
                "--concurrency",
                conc,
                "--num-requests",
                "4",
                "--prompt-len",
                "24",
                "--output-len",
                "8",
                "--warmup",
                "0",
                "--slo",
                "ttft=400ms,tpot=80ms",
                "--results-dir",
                str(base),
                "--run-name",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        paths.append(base / name)
    return paths


def test_bench_writes_a_report_with_every_section(runs):
    html = (runs[0] / "report.html").read_text()
    for section in (
        "Run settings",
        "Summary per load point",
        "Plots",
        "Cost",
        "Throughput against load",
        "CDFs of TTFT",
        "Pareto front",
        "break-even",
    ):
        assert section in html
    assert "<script" not in html and 'src="http' not in html and 'href="http' not in html


def test_report_overlays_runs_and_compares_them(runs, tmp_path):
    out = tmp_path / "both.html"
    result = subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "report", *map(str, runs), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert "Compared with the first run (first)" in html and "%)" in html


@pytest.mark.slow
def test_report_of_a_folder_that_is_no_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "not a bench run" in result.stderr and "Traceback" not in result.stderr


@needs_chromium
def test_report_renders_offline_in_headless_chromium(runs, tmp_path):
    out = tmp_path / "report.html"
    subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "report", *map(str, runs), "--out", str(out)], check=True
    )
    page = render(out, screenshot=RESULTS / "report-screenshot.png")
    assert page.errors == []
    assert all(url.startswith(("file:", "data:")) for url in page.requests), page.requests
    assert len(page.images) >= 5 and all(ok for _, ok in page.images), page.images
    assert (RESULTS / "report-screenshot.png").stat().st_size > 10_000
