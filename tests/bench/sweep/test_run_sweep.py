"""run_sweep in-process against a scripted endpoint: the matrix, the summaries' fields, resume."""

from __future__ import annotations

import json

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.matrix import point_key
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer

POINT_FIELDS = {
    *(
        "requests",
        "successful",
        "failed",
        "reconnects",
        *("structured_valid", "structured_truncated", "structured_invalid"),
        "tokens_per_chunk",
        "duration_s",
        "request_throughput",
        "output_throughput",
    ),
    *("total_token_throughput", "prompt_tokens", "output_tokens", "cached_tokens", "tokens_from"),
    *("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "errors", "slo", "goodput", "slo_attainment", "key"),
    *("server", "model", "endpoint", "prompt_len", "output_len", "load", "concurrency", "request_rate"),
    *("server_args", "stopped_early", "sessions", "session_rate", "stream", "prefix_cache_reset", "warnings"),
    "server_metrics",
    *("token_source", "replay_speed"),
    *("client", "client_limited"),
    *("saturated", "saturation_reason", "saturation", "steady_state"),
    *("server_cpu_s", "server_cores", "cpu_s_per_1k_tokens", "cpu_source"),
    *("energy_j", "joules_per_token", "energy_source", "energy_domains"),
    *("decode_weight_bytes", "decode_read_gbs", "machine_read_gbs", "decode_read_share"),
}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def config_for(endpoint: str, **kw) -> BenchConfig:
    settings = {"prompt_lens": [8, 12], "output_lens": [3], "concurrencies": [1, 2], "num_requests": 2}
    return BenchConfig.from_settings(endpoint=endpoint, warmup=1, slo="ttft=5s", **{**settings, **kw})


@pytest.mark.slow
def test_every_point_of_the_matrix_runs_and_is_summarized(openai_endpoint, tokenizer, tmp_path):
    started, done = [], []
    config = config_for(openai_endpoint.url)
    points = run_sweep(config, tmp_path / "r", False, tokenizer, lambda k, p: started.append(k), done.append)
    keys = [p.key for p in points]
    assert keys == [
        "endpoint|prompt=8|output=3|concurrency=1",
        "endpoint|prompt=8|output=3|concurrency=2",
        "endpoint|prompt=12|output=3|concurrency=1",
        "endpoint|prompt=12|output=3|concurrency=2",
    ]
    assert started == keys and done == points
    assert all(set(p.to_json()) == POINT_FIELDS for p in points)
    assert all(p.successful == 2 and p.model == "scripted" and p.server_args is None for p in points)
    run = RunDir(tmp_path / "r")
    read_back = [p.to_json() for p in run.load_summaries()]
    assert read_back == json.loads(json.dumps([p.to_json() for p in points]))
    settings = run.read_summary().settings
    assert settings.config["prompt_lens"] == [8, 12] and "api_key" not in settings.config
    assert settings.machine.cores >= 1
    assert sorted(r.point for r in run.read_records()) == sorted(keys * 2)  # warm-ups are not records
    # One warm-up and two measured requests per point, each with prompts of its own.
    prompts = [body["messages"][0]["content"] for _, body in openai_endpoint.seen]
    assert len(prompts) == 4 * 3 and len(set(prompts)) == len(prompts)


@pytest.mark.slow
def test_resume_runs_only_the_points_not_done(openai_endpoint, tokenizer, tmp_path):
    config = config_for(openai_endpoint.url)
    first = run_sweep(config, tmp_path / "r", False, tokenizer)
    with pytest.raises(BenchError, match="already holds a run"):
        run_sweep(config, tmp_path / "r", False, tokenizer)

    # As if killed during the last point: its summary never written, one record torn.
    run = RunDir(tmp_path / "r")
    run.write_summaries(first[:3], run.read_summary().settings)
    last = first[3].key
    run.records.write_text(run.records.read_text() + json.dumps({"index": 0, "point": last})[:20])
    sent_before = len(openai_endpoint.seen)
    resumed = run_sweep(config, tmp_path / "r", True, tokenizer)
    assert [p.key for p in resumed] == [p.key for p in first]
    assert [p.to_json() for p in resumed[:3]] == json.loads(json.dumps([p.to_json() for p in first[:3]]))
    assert len(openai_endpoint.seen) - sent_before == 3  # one point: a warm-up and two requests

    # The point's place in the matrix seeds its prompts: the resumed point sends what it sent before.
    def sent(requests: list) -> list[str]:  # the order within a point of concurrency 2 is the server's
        return sorted(json.dumps(body) for _, body in requests)

    assert sent(openai_endpoint.seen[sent_before:]) == sent(openai_endpoint.seen[9:12])
    records = run.read_records()
    assert len(records) == 8 and sum(r.point == last for r in records) == 2

    again = run_sweep(config, tmp_path / "r", True, tokenizer)
    assert len(again) == 4 and len(openai_endpoint.seen) - sent_before == 3  # nothing left to do


def test_a_point_key_names_server_lengths_and_load():
    [point] = BenchConfig.from_settings(request_rates=[2.5]).load_points()
    assert point_key("batch-4", 128, 64, point) == "batch-4|prompt=128|output=64|rate=2.5/s"


def test_resume_refuses_a_run_with_other_settings(openai_endpoint, tokenizer, tmp_path):
    config = config_for(openai_endpoint.url, concurrencies=[1], prompt_lens=[8])
    run_sweep(config, tmp_path / "r", False, tokenizer)
    run = RunDir(tmp_path / "r")
    before = (run.summary.read_text(), run.records.read_text(), len(openai_endpoint.seen))

    with pytest.raises(BenchError, match=r"^cannot resume: workload was 'random', now 'copy' \("):
        run_sweep(config.replaced(dict(workload="copy")), run.path, True, tokenizer)
    changed = config.replaced(dict(seed=3, output_lens=[4], api="completions", model="other"))
    with pytest.raises(BenchError) as refused:
        run_sweep(changed, run.path, True, tokenizer)
    message = str(refused.value)
    for difference in ("seed was 0, now 3", "output_lens was [3], now [4]", "model was None, now 'other'"):
        assert difference in message
    assert "api was 'chat', now 'completions'" in message
    moved = config.replaced(dict(endpoint="http://127.0.0.1:1/v1", concurrencies=[1, 2]))
    with pytest.raises(BenchError, match="endpoint was .*; concurrencies was \\[1\\], now \\[1, 2\\]"):
        run_sweep(moved, run.path, True, tokenizer)
    # A refused resume changes nothing and sends nothing.
    assert (run.summary.read_text(), run.records.read_text(), len(openai_endpoint.seen)) == before


def test_resume_ignores_settings_that_do_not_change_a_points_numbers(openai_endpoint, tokenizer, tmp_path):
    config = config_for(openai_endpoint.url, concurrencies=[1], prompt_lens=[8])
    run_sweep(config, tmp_path / "r", False, tokenizer)
    same = config.replaced(dict(request_timeout=5.0, api_key="another", recipe="elsewhere.toml"))
    assert len(run_sweep(same, tmp_path / "r", True, tokenizer)) == 1


def test_resume_of_a_run_recorded_without_a_setting_does_not_compare_it(openai_endpoint, tokenizer, tmp_path):
    config = config_for(openai_endpoint.url, concurrencies=[1], prompt_lens=[8])
    run_sweep(config, tmp_path / "r", False, tokenizer)
    run = RunDir(tmp_path / "r")
    summary = run.read_summary()
    del summary.settings.config["ignore_eos"]  # as a bench before that setting wrote it
    run.write_summaries(summary.points, summary.settings)
    assert len(run_sweep(config.replaced(dict(ignore_eos=False)), run.path, True, tokenizer)) == 1
