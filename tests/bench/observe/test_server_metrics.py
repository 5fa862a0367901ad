"""The server's own metrics over each point: /metrics scraped in the background while the point runs,
written to server_metrics.jsonl and summed up in the point's summary. Scripted stubs whose page changes
with every scrape, and one short check against the live `llmopt serve`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.observe.server_metrics import ServerSample, read_sample
from llmopt.bench.observe.server_stats import parse_metrics
from llmopt.bench.rundir import RunDir
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from tests.conftest import API_KEY

VLLM_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {n}
vllm:num_requests_waiting{{model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{model_name="m"}} {usage}
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafts}
vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}
"""


class ChangingPage:
    """A vLLM-named page that moves on at every scrape n: n running, 2n waiting, n % KV used, and
    counters growing 100 prompt tokens looked up (40 hits) and 10 proposed tokens (7 accepted) a scrape."""

    def __init__(self):
        self.scrapes = 0
        self.lock = threading.Lock()

    def __call__(self) -> str:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        return VLLM_PAGE.format(
            n=n, waiting=2 * n, usage=n / 100, queries=100 * n, hits=40 * n, drafts=10 * n, accepted=7 * n
        )


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def rate_config(endpoint: str, **kw) -> BenchConfig:
    """Ten requests at 20/s, evenly spaced: a point of about half a second."""
    settings = {"request_rates": [20.0], "arrival": "constant", "num_requests": 10, "metrics_interval": 0.05}
    return BenchConfig.from_settings(
        endpoint=endpoint, prompt_lens=[8], output_lens=[3], warmup=0, **{**settings, **kw}
    )


def test_read_sample_takes_llmopt_names_then_vllms():
    llmopt = parse_metrics(
        "llmopt:num_requests_running 3\nllmopt:num_requests_waiting 1\nllmopt:kv_blocks_used 12\n"
        "llmopt:kv_blocks_total 48\nvllm:num_requests_running 99\n"
    )
    sample = read_sample(llmopt, 1.5)
    assert (sample.t, sample.running, sample.waiting, sample.kv_blocks_used) == (1.5, 3, 1, 12)
    assert sample.kv_cache_usage == 0.25  # 12 of 48 blocks
    vllm = read_sample(
        parse_metrics(VLLM_PAGE.format(n=2, waiting=0, usage=0.5, queries=0, hits=0, drafts=0, accepted=0)), 0
    )
    assert (vllm.running, vllm.kv_cache_usage, vllm.kv_blocks_used) == (2, 0.5, None)
    assert read_sample(parse_metrics("process_cpu_seconds_total 4\n"), 0) is None  # no engine's page


@pytest.mark.slow
def test_each_point_samples_the_servers_metrics_page(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.metrics = ChangingPage()
    [point] = run_sweep(rate_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    samples = RunDir(tmp_path / "r").read_server_metrics()
    assert len(samples) >= 5 and point.server_metrics.samples == len(samples)
    assert {s["point"] for s in samples} == {point.key} and {s["run"] for s in samples} == {0}
    # One line per scrape, in order: the page's n-th values (the machine meter's own scrapes of the page, at
    # the point's start and end, are no samples), times rising from the point's start.
    running = [s["running"] for s in samples]
    assert running == sorted(set(running)) and running[0] == 1 and running[-1] <= len(samples) + 2
    assert all(
        s["waiting"] == 2 * s["running"] and s["kv_cache_usage"] == s["running"] / 100 for s in samples
    )
    times = [s["t"] for s in samples]
    assert times == sorted(times) and times[0] < 0.05 and 0.3 < times[-1] < 5
    # Rates over each interval from the counters: 40 of 100 tokens hit, 7 of 10 proposals accepted.
    assert "prefix_cache_hit_rate" not in samples[0]  # the first has no interval before it
    assert all(s["prefix_cache_hit_rate"] == 0.4 and s["spec_acceptance"] == 0.7 for s in samples[1:])
    summary = point.server_metrics
    assert summary.prefix_cache_hit_rate == pytest.approx(0.4)
    assert summary.spec_acceptance == pytest.approx(0.7)
    assert 1 <= summary.running_mean <= summary.running_max <= len(samples)
    assert summary.waiting_max == 2 * summary.running_max
    assert summary.engine == "vllm" and summary.preemptions is None  # the page has no such counter


@pytest.mark.slow
def test_no_page_or_interval_zero_samples_nothing(openai_endpoint, tokenizer, tmp_path):
    [point] = run_sweep(rate_config(openai_endpoint.url), tmp_path / "none", False, tokenizer)
    assert point.server_metrics is None and point.successful == 10  # quietly: no page, no samples
    assert not RunDir(tmp_path / "none").server_metrics.exists()
    page = openai_endpoint.metrics = ChangingPage()
    [point] = run_sweep(
        rate_config(openai_endpoint.url, metrics_interval=0), tmp_path / "off", False, tokenizer
    )
    assert point.server_metrics is None and not RunDir(tmp_path / "off").server_metrics.exists()
    # Only the machine meter looked, once, for a CPU counter (token_cost.py): the page has none.
    assert page.scrapes == 1 and point.cpu_source == "no process_cpu_seconds_total on the server's /metrics"


def test_an_earlier_runs_samples_read_with_todays_names(tmp_path):
    """rounds.jsonl of a run written before the names were the canonical ones: --resume still reads it
    (the run folder reads it back under today's names), and a key a sample does not know is left out."""
    old = {"t": 0.5, "running": 2, "kv_usage": 0.5, "prefix_hit_rate": 0.25, "a_later_field": 1}
    run = RunDir(tmp_path)
    run.append_round({"point": "a", "round": 0, "runs": [{"repeat": 0, "samples": [old]}]})
    [entry] = run.read_rounds()
    sample = ServerSample.from_json(entry["runs"][0]["samples"][0])
    assert (sample.t, sample.running, sample.kv_cache_usage, sample.prefix_cache_hit_rate) == (
        0.5,
        2,
        0.5,
        0.25,
    )
    assert ServerSample.from_json(sample.to_json()) == sample


def test_resume_keeps_only_the_samples_of_finished_points(tmp_path):
    run = RunDir(tmp_path)
    run.path.mkdir(exist_ok=True)
    run.append_server_metrics(
        [{"point": "a", "t": 0.0, "running": 1}, {"point": "b", "t": 0.0, "running": 2}]
    )
    with open(run.server_metrics, "a") as f:
        f.write('{"point": "a", "t"')  # torn by a crash
    run.keep_records_of({"a"})
    assert run.read_server_metrics() == [{"point": "a", "t": 0.0, "running": 1}]


@pytest.mark.slow
def test_a_bad_interval_is_refused():
    with pytest.raises(BenchError, match="--metrics-interval"):
        BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", metrics_interval=-1).validate()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmopt.cli",
            "bench",
            "--endpoint",
            "http://127.0.0.1:1/v1",
            "--metrics-interval",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        result.returncode != 0 and "--metrics-interval" in result.stderr and "Traceback" not in result.stderr
    )


def test_the_live_server_counts_its_running_requests(server, tmp_path):
    """Two streams of 24 tokens at once against the real model: the server says it runs them."""
    command = [
        sys.executable,
        "-m",
        "llmopt.cli",
        "bench",
        "--endpoint",
        server.url + "/v1",
        "--api-key",
        API_KEY,
    ]
    command += ["--concurrency", "2", "--num-requests", "2", "--prompt-len", "16", "--output-len", "24"]
    command += [
        "--warmup",
        "0",
        "--metrics-interval",
        "0.1",
        "--results-dir",
        str(tmp_path),
        "--run-name",
        "m",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr + result.stdout
    [point] = json.loads((tmp_path / "m" / "summary.json").read_text())["points"]
    samples = RunDir(tmp_path / "m").read_server_metrics()
    assert max(s["running"] for s in samples) >= 1 and point["server_metrics"]["running_max"] >= 1
    assert all(0 <= s["kv_cache_usage"] <= 1 for s in samples) and "prefix_queries" in samples[-1]
    # What a decode step reads of the weights (the server's figure) over the ITL, beside this machine's
    # read bandwidth: a real fraction of it, as a new user's run shows it with no flags.
    assert point["decode_weight_bytes"] > 1e8 and point["machine_read_gbs"] > 1
    assert point["decode_read_gbs"] > 0.5 and 0 < point["decode_read_share"] < 1.5
