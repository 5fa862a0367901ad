"""The report's server-metrics section: a table row per sampled point and, for the busiest points, the
server's series over time beside the client's timeline; rendered in headless Chromium. Synthetic run
folders with known samples: no model, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.bench.rundir import RunDir
from llmopt.report.html import write_report
from llmopt.report.runs import load_run
from llmopt.report.server_metrics_section import HEADERS, chosen_points, samples_of, server_metric_rows
from tests.report.browser import needs_chromium, render
from tests.run_folders import FakePoint, write_run

SUMMARY = {
    "samples": 6,
    "engine": "vllm",
    "running_mean": 2.5,
    "running_max": 4,
    "waiting_mean": 0.5,
    "waiting_max": 3,
    "kv_cache_usage_mean": 0.4,
    "kv_cache_usage_max": 0.75,
    "prefix_cache_hit_rate": 0.25,
    "preemptions": 2,
    "spec_acceptance": None,
}
# A llama.cpp server's: no KV cache gauge, no preemption counter.
LLAMA_CPP_SUMMARY = {
    **SUMMARY,
    "engine": "llama.cpp",
    "kv_cache_usage_mean": None,
    "kv_cache_usage_max": None,
    "preemptions": None,
}
# As a run written before the names were the canonical ones holds it.
EARLIER_SUMMARY = {
    "samples": 6,
    "running_mean": 1.0,
    "running_max": 1,
    "waiting_mean": 0.0,
    "waiting_max": 0,
    "kv_usage_mean": 0.1,
    "kv_usage_max": 0.2,
    "prefix_hit_rate": 0.5,
    "spec_acceptance": None,
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    points = [
        FakePoint(8, 0.1, 2.0, extra={"server_metrics": SUMMARY}),
        FakePoint(8, 0.1, 2.0, concurrency=4),
        FakePoint(8, 0.1, 2.0, server="llamacpp", extra={"server_metrics": LLAMA_CPP_SUMMARY}),
        FakePoint(8, 0.1, 2.0, server="earlier", extra={"server_metrics": EARLIER_SUMMARY}),
    ]
    path = write_run(tmp_path_factory.mktemp("sm") / "sampled", points)
    key = points[0].key
    samples = [
        {
            "point": key,
            "run": 0,
            "t": 0.5 * i,
            "running": i % 5,
            "waiting": max(0, i - 3),
            "kv_cache_usage": i / 8,
        }
        for i in range(6)
    ]
    for s in samples[1:]:
        s["prefix_cache_hit_rate"] = 0.25
    RunDir(path).append_server_metrics(samples + [{**samples[0], "run": 1}])  # a second run: not drawn
    return path


def test_a_row_per_sampled_point_whichever_engine(run_dir):
    rows = server_metric_rows(load_run(run_dir))  # the second point has no samples: no row
    vllm, llama, earlier = (dict(zip(HEADERS, row)) for row in rows)
    assert vllm["load"] == "concurrency=1" and vllm["samples"] == "6" and vllm["metrics of"] == "vllm"
    assert (vllm["running mean (requests)"], vllm["running max (requests)"]) == ("2.5", "4")
    assert vllm["waiting max (requests)"] == "3" and vllm["KV cache usage max (%)"] == "75.0"
    assert vllm["prefix-cache hit rate (%)"] == "25.0" and vllm["spec acceptance (%)"] == "-"
    assert vllm["preemptions (requests)"] == "2"
    # The same columns for llama.cpp; what it does not publish reads "-", never 0.
    assert llama["metrics of"] == "llama.cpp" and llama["running max (requests)"] == "4"
    assert llama["KV cache usage mean (%)"] == "-" and llama["preemptions (requests)"] == "-"
    # A run written with the earlier names reads the same way.
    assert earlier["KV cache usage max (%)"] == "20.0" and earlier["prefix-cache hit rate (%)"] == "50.0"
    assert earlier["metrics of"] == "-" and earlier["preemptions (requests)"] == "-"


def test_the_busiest_sampled_point_is_drawn_with_its_first_runs_samples(run_dir):
    [(_, point, samples)] = chosen_points([load_run(run_dir)], 4)
    assert point.load == "concurrency=1" and len(samples) == 6  # the busier point has no samples
    assert samples[2]["kv_cache_usage"] == 0.25 and samples[2]["prefix_cache_hit_rate"] == 0.25


def test_an_earlier_runs_samples_are_drawn_with_todays_names(tmp_path):
    point = FakePoint(8, 0.1, 2.0)
    path = write_run(tmp_path / "earlier", [point])
    RunDir(path).append_server_metrics(
        [{"point": point.key, "t": 0.5, "kv_usage": 0.5, "prefix_hit_rate": 0.2}]
    )
    [sample] = samples_of(load_run(path))[point.key]
    assert (sample["kv_cache_usage"], sample["prefix_cache_hit_rate"]) == (0.5, 0.2)


@pytest.mark.slow
def test_the_report_shows_the_section_only_where_the_server_was_sampled(run_dir, tmp_path):
    html = write_report([run_dir], tmp_path / "r.html").read_text()
    assert "<h2>Server metrics during each point</h2>" in html
    assert 'alt="server metrics over time beside the client' in html
    plain = write_run(tmp_path / "plain", [FakePoint(5)])
    assert "Server metrics during" not in write_report([plain], tmp_path / "p.html").read_text()


@needs_chromium
@pytest.mark.slow
def test_the_server_metrics_report_renders_in_headless_chromium(run_dir, tmp_path):
    page = render(write_report([run_dir], tmp_path / "report.html"))
    assert page.errors == [] and all(url.startswith(("file:", "data:")) for url in page.requests)
    assert all(ok for _, ok in page.images), page.images
    assert any(alt.startswith("server metrics over time") for alt, _ in page.images)
