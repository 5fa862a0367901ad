"""--num-runs: each point runs several times with fresh prompts; its summary pools the records and gives
each headline metric's runs, mean and bootstrap 95 % interval; the report draws them as error bars."""

from __future__ import annotations

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.repeats import bootstrap_ci, repeat_stats
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.report.html import write_report


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def test_a_bootstrap_interval_holds_the_mean_inside_the_values():
    low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    # The mean of 1..5 has a standard error of 0.63: the interval is about 3 ± 1.2, not the values' range.
    assert 1.6 < low < 2.0 and 4.0 < high < 4.4
    assert bootstrap_ci([2.5]) == (2.5, 2.5)
    assert bootstrap_ci([1.0, 9.0, 4.0]) == bootstrap_ci([1.0, 9.0, 4.0])  # seeded: the same every time
    tight = bootstrap_ci([3.0, 3.1, 2.9, 3.0])
    assert tight[1] - tight[0] < 0.2


def test_repeat_stats_cover_the_headline_metrics_every_run_has():
    runs = [
        {"request_throughput": v, "output_throughput": 10 * v, "ttft_ms": {"median": v, "p99": None}}
        for v in (1.0, 2.0, 3.0)
    ]
    stats = repeat_stats(runs)
    assert stats["runs"] == 3 and set(stats["metrics"]) == {
        "request_throughput",
        "output_throughput",
        "ttft_ms.median",
    }
    throughput = stats["metrics"]["request_throughput"]
    assert throughput["values"] == [1.0, 2.0, 3.0] and throughput["mean"] == 2.0
    assert throughput["ci95"][0] <= 2.0 <= throughput["ci95"][1]


@pytest.mark.slow
def test_a_point_runs_num_runs_times_with_fresh_prompts(openai_endpoint, tokenizer, tmp_path):
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        prompt_lens=[8],
        output_lens=[3],
        concurrencies=[1],
        num_requests=2,
        warmup=0,
        num_runs=3,
    )
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert (point.requests, point.successful) == (6, 6)
    prompts = [body["messages"][0]["content"] for _, body in openai_endpoint.seen]
    assert len(prompts) == 6 and len(set(prompts)) == 6
    repeats = point.repeats
    assert repeats.runs == 3
    for name in ("request_throughput", "output_throughput", "ttft_ms.median", "e2e_ms.median"):
        metric = repeats.metrics[name]
        assert len(metric.values) == 3 and metric.ci95[0] <= metric.mean <= metric.ci95[1]
    run = RunDir(tmp_path / "r")
    assert len(run.read_records()) == 6 and len(openai_endpoint.resets) == 3  # a reset before every run
    assert write_report([run.path], tmp_path / "report.html").is_file()


@pytest.mark.slow
def test_a_repeated_multi_turn_point_numbers_its_sessions_apart(openai_endpoint, tokenizer, tmp_path):
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        workload="multi-turn",
        sessions=[2],
        turns=2,
        system_len=4,
        prompt_lens=[4],
        output_lens=[2],
        num_requests=4,
        warmup=0,
        num_runs=2,
    )
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert point.conversations.started == point.conversations.completed == 4
    assert sorted({r.session for r in RunDir(tmp_path / "r").read_records()}) == [0, 1, 2, 3]


def test_num_runs_must_be_at_least_one():
    with pytest.raises(BenchError, match="--num-runs must be >= 1"):
        BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", num_runs=0).validate()
