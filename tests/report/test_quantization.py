"""The report's quantization section: the Pareto front on hand-made points, and the section of a
synthetic run whose configs were quantized (their quant_report.json figures in the run's settings, as
bench/servers/quantized_serve.py records them): table, answer and plot. No model, no server."""

from __future__ import annotations

import base64
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import QuantizationRecord
from llmopt.pricing import load_pricing
from llmopt.report.html import write_report
from llmopt.report.quantization import (
    QuantPoint,
    mark_fronts,
    on_front,
    quality_measure,
    quantization_section,
)
from llmopt.report.runs import load_run
from tests.report.browser import needs_chromium, render
from tests.run_folders import FakePoint, write_run


def test_the_front_keeps_the_points_nothing_beats_on_both():
    points = [(10, 15.0), (20, 16.0), (15, 14.0), (5, 20.0), (15, 14.5), (20, 17.0)]
    # (15, 14) beats (10, 15) and (15, 14.5); (20, 16) beats (20, 17); the fastest and the best survive
    assert on_front(points) == [False, True, True, False, False, False]


def test_the_cost_front_is_its_own():
    # On one GPU price cost follows throughput; with prices of their own the fronts can differ.
    points = [
        QuantPoint("fp32", "none", 538, 14.2, 14.2, 40.0, 3.0, ""),
        QuantPoint("int8", "int8", 160, 14.3, 14.2, 60.0, 1.0, ""),
        QuantPoint("gptq", "gptq", 174, 15.3, 14.2, 80.0, 2.0, ""),
        QuantPoint("awq", "awq", 170, 16.0, 14.2, 70.0, 2.5, ""),
        QuantPoint("broken", "awq", 170, None, 14.2, 90.0, 0.5, ""),  # no perplexity: on no front
    ]
    mark_fronts(points)
    assert [p.front_throughput for p in points] == [True, True, True, False, False]
    # gptq is the fastest, but int8 costs less here at a lower perplexity
    assert [p.front_cost for p in points] == [True, True, False, False, False]


def quant_record(method: str, size: float, ppl: float) -> dict:
    return {
        "method": method,
        "settings": {},
        "checkpoint": f"/cache/{method}",
        "cached": True,
        "size_before_mb": 538.1,
        "size_after_mb": size,
        "perplexity_before": 14.0,
        "perplexity": ppl,
        "source": "/models/smollm2",
        "model": None,
    }


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory) -> Path:
    """Four configs at concurrency 1 and 4: output tokens/s = 40 requests * 10 tokens / wall seconds."""
    walls = {"fp32": (20.0, 10.0), "int8": (12.5, 6.25), "gptq": (10.0, 5.0), "awq": (16.0, 8.0)}
    points = [
        FakePoint(40, 0.1, wall, server=server, concurrency=conc, seed=i)
        for i, (server, pair) in enumerate(walls.items())
        for conc, wall in zip((1, 4), pair)
    ]
    path = write_run(tmp_path_factory.mktemp("quant") / "quantized", points, slo="ttft=1s")
    run = RunDir(path)
    summary = run.read_summary()
    records = {
        "fp32": {**quant_record("none", 538.1, 14.0), "checkpoint": None},
        "int8": quant_record("int8", 160.0, 14.07),  # +0.5 %, 64 tok/s
        "gptq": quant_record("gptq", 174.0, 15.4),  # +10 %, 80 tok/s: the fastest
        "awq": quant_record("awq", 170.0, 16.1),  # +15 %, 50 tok/s: beaten by int8 on both
    }
    summary.settings.quantization = {server: QuantizationRecord(r) for server, r in records.items()}
    run.write_summaries(summary.points, summary.settings)
    return path


def test_the_section_says_which_quantization_to_deploy(quantized_run):
    section = quantization_section(load_run(quantized_run), load_pricing())
    rows = {row[0]: row for row in section.rows}
    assert rows["gptq"][1:7] == ["gptq", "174.0", "15.400", "+10.0", "-", "80.0"]  # an old report: no KLD
    assert rows["gptq"][8] == "throughput, cost"
    assert rows["awq"][8] == "no" and rows["fp32"][8] == "throughput, cost" and rows["fp32"][4] == "+0.0"
    assert rows["int8"][6] == "64.0" and rows["int8"][8] == "throughput, cost"
    # the cheapest GPU hour of the pricing file (runpod/L4, $0.44/h) at 80 tok/s: 0.44 / 3600 / 80 * 1e6
    assert section.pricing == "runpod/L4 at $0.44/h" and rows["gptq"][7] == "$1.5278"
    assert rows["gptq"][9] == "concurrency=4: the busiest point with 90% of requests within the SLOs"
    assert section.quality == "perplexity" and "perplexity (lower is better)" in figure_text(section)
    assert section.answer.startswith("Worth deploying (on the Pareto front): fp32 (none), int8 (int8), gptq")
    assert "awq lose to one of them on both" in section.answer
    svg = ET.fromstring(base64.b64decode(section.figure))
    assert svg.tag.endswith("svg") and "Pareto front" in figure_text(section)


def figure_text(section) -> str:
    return base64.b64decode(section.figure).decode()


def test_the_kl_divergence_is_the_quality_where_every_config_has_one():
    # On perplexity gptq beats awq on both axes; on the KLD awq is closer to the source, so on the front.
    points = [
        QuantPoint("int8", "int8", 160, 14.3, 14.2, 60.0, 1.0, "", kld=0.002),
        QuantPoint("gptq", "gptq", 174, 15.3, 14.2, 80.0, 0.8, "", kld=0.09),
        QuantPoint("awq", "awq", 170, 16.0, 14.2, 70.0, 0.9, "", kld=0.05),
    ]
    assert quality_measure(points) == "kld"
    mark_fronts(points)
    assert [p.front_throughput for p in points] == [True, True, True]
    points[2].kld = None  # a report from before llmopt measured the KLD: all compared on perplexity
    assert quality_measure(points) == "perplexity"
    mark_fronts(points)
    assert [p.front_throughput for p in points] == [True, True, False]


@pytest.fixture(scope="module")
def kld_run(quantized_run, tmp_path_factory) -> Path:
    """The quantized run again, its records with the KL divergence from the source that quantize measures
    now (fp32's from the source against itself)."""
    path = tmp_path_factory.mktemp("kld") / "quantized"
    shutil.copytree(quantized_run, path)
    run = RunDir(path)
    summary = run.read_summary()
    klds = {"fp32": 0.0, "int8": 0.004, "gptq": 0.12, "awq": 0.08}
    for server, kld in klds.items():
        summary.settings.quantization[server].record["kl_divergence"] = {"mean": kld, "p99": 10 * kld}
    run.write_summaries(summary.points, summary.settings)
    return path


def test_the_section_plots_the_kl_divergence_when_every_config_has_one(kld_run):
    section = quantization_section(load_run(kld_run), load_pricing())
    rows = {row[0]: row for row in section.rows}
    assert [rows[s][5] for s in ("fp32", "int8", "gptq", "awq")] == [
        "0.000000",
        "0.004000",
        "0.120000",
        "0.080000",
    ]
    # awq (50 tok/s) loses to int8 (64 tok/s) on KLD too; the others are each the best at their speed
    assert [rows[s][8] for s in ("fp32", "int8", "gptq", "awq")] == ["throughput, cost"] * 3 + ["no"]
    assert section.quality == "mean KL divergence from the fp32 source"
    assert "mean KL divergence from the fp32 source (lower is better)" in figure_text(section)


@pytest.mark.slow
def test_the_report_has_the_section_only_for_quantized_runs(quantized_run, tmp_path):
    plain = write_run(tmp_path / "plain", [FakePoint(10, 0.1, 5.0)])
    html = write_report([plain, quantized_run], tmp_path / "r.html").read_text()
    section = html[html.index("<h2>Quantization</h2>") :]
    assert "<h3>quantized</h3>" in section and "<h3>plain</h3>" not in section
    assert "perplexity against throughput and against cost per 1M output tokens" in section
    assert "Δ perplexity (%)" in section and "$ per 1M output tokens" in section
    alone = write_report([plain], tmp_path / "plain.html").read_text()
    assert "<h2>Quantization</h2>" not in alone


@needs_chromium
@pytest.mark.slow
def test_the_section_renders_in_headless_chromium(quantized_run, tmp_path):
    page = render(write_report([quantized_run], tmp_path / "report.html"))
    assert page.errors == [] and all(ok for _, ok in page.images), page.images
    assert "perplexity against throughput and cost" in [alt for alt, _ in page.images]
