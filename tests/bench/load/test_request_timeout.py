"""--request-timeout: a server that stops sending fails that request after so many seconds instead of
hanging the run; a long answer that keeps coming is no timeout, however long it takes in all."""

from __future__ import annotations

import time

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from tests.bench.conftest import stall


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def config_for(endpoint: str, **kw) -> BenchConfig:
    settings = {"prompt_lens": [8], "output_lens": [3], "num_requests": 2, "warmup": 0}
    return BenchConfig.from_settings(endpoint=endpoint, **{**settings, **kw})


@pytest.mark.slow
def test_a_stalled_stream_fails_its_request_after_the_timeout(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.replies.append(stall())  # one chunk, then silence
    started = time.perf_counter()
    [point] = run_sweep(
        config_for(openai_endpoint.url, request_timeout=0.5), tmp_path / "r", False, tokenizer
    )
    assert time.perf_counter() - started < 10
    assert (point.successful, point.failed) == (1, 1)
    [error] = point.errors
    assert error.startswith("timeout: nothing received for 0.5 s")
    assert RunDir(tmp_path / "r").read_summary().settings.config["request_timeout"] == 0.5


@pytest.mark.slow
def test_a_slow_steady_stream_is_no_timeout(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.replies.append(stall(gap_s=0.2, chunks=6, then_stop=False))  # 1.2 s in all
    config = config_for(openai_endpoint.url, request_timeout=0.6, num_requests=1)
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert point.successful == 1 and point.e2e_ms["mean"] > 1000


def test_the_timeout_is_a_flag_and_a_recipe_key(tmp_path, monkeypatch):
    from llmopt.bench.sweep.bench_config import with_overrides
    from llmopt.bench.sweep.recipe import load_recipe
    from llmopt.cli.bench import settings_from_options
    from tests.bench.sweep.test_config import bench_options

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = tmp_path / "r.toml"
    path.write_text("[target]\nendpoint = 'http://127.0.0.1:1/v1'\n[load]\nrequest_timeout = 30\n")
    assert load_recipe(path).load.request_timeout == 30
    assert BenchConfig().load.request_timeout == 600
    options = settings_from_options(bench_options("--recipe", str(path), "--request-timeout", "2.5"))
    assert with_overrides(load_recipe(path), options).load.request_timeout == 2.5
    with pytest.raises(BenchError, match="--request-timeout must be a positive"):
        config_for("http://127.0.0.1:1/v1", request_timeout=0).validate()
