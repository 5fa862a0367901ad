"""--stop-on-saturation: the online check's view of a running point, the series a saturated point rules
out, the setting from a recipe or the flag, and a sweep against a stub of known capacity that stops its
saturated point and skips the higher load."""

from __future__ import annotations

import csv
import io
import json

import pytest

from llmopt.bench.load.load_point import Collector, LoadPoint
from llmopt.bench.load.stop_on_saturation import STOP_REASON, sent_so_far, skip_reason
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, SkippedPoint
from llmopt.bench.sweep.bench_config import BenchConfig, with_overrides
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from tests.bench.conftest import Capacity
from tests.bench.sweep.test_config import bench_options


def test_the_online_view_counts_requests_due_and_unanswered_as_in_flight():
    point = LoadPoint(request_rate=10, arrival="constant", num_requests=50, max_seconds=1.95)
    collect = Collector(point)
    collect(RequestRecord(index=0, start=0.0, ttft=0.1, e2e=0.2, success=True))
    collect(RequestRecord(index=2, start=0.2, error="HTTP 500: boom"))  # ended: neither answered nor due
    times = point.arrivals(50)
    now = sent_so_far(point, collect, times, 0.45)
    assert [(round(s.due, 9), s.end) for s in now] == [(0.0, 0.2), (0.1, None), (0.3, None), (0.4, None)]
    # Past --max-seconds nothing more was sent: no arrival after it is in flight.
    assert len(sent_so_far(point, collect, times, 60.0)) == 1 + 20 - 2
    closed = LoadPoint(concurrency=4, num_requests=50)
    assert len(sent_so_far(closed, Collector(closed), None, 5.0)) == 0


def summary(load: dict, saturated: bool, **fields) -> PointSummary:
    point = {"server": "s", "prompt_len": 16, "output_len": 2, "stream": True, "habit": None}
    point.update(concurrency=None, request_rate=None, sessions=None, session_rate=None, replay_speed=None)
    name, value = next(iter(load.items()))
    label = f"rate={value:g}/s" if name == "request_rate" else f"concurrency={value}"
    fields = {**point, **load, "load": label, "saturated": saturated, "saturation_reason": "why", **fields}
    return PointSummary.from_json(fields)


def test_a_saturated_point_rules_out_the_higher_loads_of_its_series_only():
    done = [summary({"request_rate": 4.0}, True), summary({"concurrency": 2}, False)]
    cell = (16, 2, LoadPoint(request_rate=8.0))
    assert skip_reason(done, "s", cell) == "rate=4/s saturated (why), so no higher request_rate runs"
    assert skip_reason(done, "s", (16, 2, LoadPoint(request_rate=2.0))) is None  # a lower load
    assert skip_reason(done, "other", cell) is None  # another server
    assert skip_reason(done, "s", (128, 2, LoadPoint(request_rate=8.0))) is None  # another prompt length
    assert skip_reason(done, "s", (16, 2, LoadPoint(request_rate=8.0, stream=False))) is None
    assert skip_reason(done, "s", (16, 2, LoadPoint(concurrency=8))) is None  # concurrency 2 did not
    assert skip_reason([summary({"concurrency": 2}, True)], "s", (16, 2, LoadPoint(concurrency=8)))


def test_the_setting_comes_from_a_recipe_or_the_flag(tmp_path, monkeypatch):
    from llmopt.cli.bench import settings_from_options

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[target]\nendpoint = "http://127.0.0.1:1/v1"\n[load]\nrequest_rate = [2, 4]\n')
    assert not any(p.stop_on_saturation for p in load_recipe(recipe).load_points())
    flagged = with_overrides(
        load_recipe(recipe), settings_from_options(bench_options("--stop-on-saturation"))
    )
    assert flagged.load.stop_on_saturation and all(p.stop_on_saturation for p in flagged.load_points())
    recipe.write_text(recipe.read_text() + "stop_on_saturation = true\n")
    config = load_recipe(recipe)
    assert config.load.stop_on_saturation and all(p.stop_on_saturation for p in config.load_points())
    unset = with_overrides(config, settings_from_options(bench_options("--no-stop-on-saturation")))
    assert not unset.load.stop_on_saturation


@pytest.mark.slow  # real-time arrivals against a stub that serves 20 requests per second
def test_a_sweep_stops_its_saturated_point_and_skips_the_higher_load(
    openai_endpoint, tokenizer_dir, tmp_path
):
    openai_endpoint.capacity = Capacity(slots=2, service_s=0.1)
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        api="completions",
        prompt_lens=[16],
        output_lens=[2],
        request_rates=[40, 80],  # twice and four times what it serves
        arrival="constant",
        num_requests=200,  # 5 s of arrivals at 40/s, were it not stopped
        warmup=0,
        metrics_interval=0,
        stop_on_saturation=True,
    )
    skipped = []
    points = run_sweep(
        config,
        tmp_path / "run",
        False,
        load_tokenizer(tokenizer_dir),
        on_point_skipped=lambda *s: skipped.append(s),
    )
    [point] = points
    assert point.saturated and point.stopped_early == STOP_REASON
    assert point.saturation_reason.startswith("TTFT")
    assert 20 <= point.requests < 150 and point.requests == len(openai_endpoint.seen)
    key = point.key.replace("rate=40/s", "rate=80/s")
    assert skipped == [
        (key, f"rate=40/s saturated ({point.saturation_reason}), so no higher request_rate runs")
    ]
    run = RunDir(tmp_path / "run")
    assert run.read_summary().settings.skipped == [SkippedPoint(key, skipped[0][1])]
    stored = json.loads(run.summary.read_text())["points"][0]
    assert stored["saturated"] is True and stored["steady_state"]["of"] == point.successful
    [row] = csv.DictReader(io.StringIO(run.summary_csv.read_text()))
    assert row["saturated"] == "True" and row["saturation_reason"] == point.saturation_reason
    assert row["steady_of"] == str(point.successful)
