"""Prefix-cache hygiene against the scripted endpoint: /reset_prefix_cache before every point where
the server has it, and a warning on a point that an earlier point's (or its warm-up's) cache may serve."""

from __future__ import annotations

import json

import pytest

from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def file_config(endpoint: str, path, **kw) -> BenchConfig:
    settings = {
        "workload": "file",
        "dataset": str(path),
        "concurrencies": [1, 2],
        "num_requests": 2,
        "warmup": 0,
    }
    return BenchConfig.from_settings(endpoint=endpoint, api_key="k", **{**settings, **kw})


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "\n".join(json.dumps({"prompt": f"prompt number {i}", "max_tokens": 2}) for i in range(2))
    )
    return path


def test_the_cache_is_reset_before_every_point_where_the_server_can(
    openai_endpoint, tokenizer, tmp_path, prompts
):
    openai_endpoint.reset_status = 200
    points = run_sweep(file_config(openai_endpoint.url, prompts), tmp_path / "r", False, tokenizer)
    assert openai_endpoint.resets == ["Bearer k", "Bearer k"]
    assert [(p.prefix_cache_reset, p.warnings) for p in points] == [(True, []), (True, [])]


def test_a_point_an_earlier_point_may_have_warmed_is_warned_about(
    openai_endpoint, tokenizer, tmp_path, prompts
):
    points = run_sweep(file_config(openai_endpoint.url, prompts), tmp_path / "r", False, tokenizer)
    assert len(openai_endpoint.resets) == 2 and [p.prefix_cache_reset for p in points] == [False, False]
    first, second = (p.warnings for p in points)
    assert first == [] and len(second) == 1 and "sends the prompts of an earlier point" in second[0]


def test_no_reset_when_told_not_to_and_the_warm_up_of_a_file_is_warned_about(
    openai_endpoint, tokenizer, tmp_path, prompts
):
    openai_endpoint.reset_status = 200
    config = file_config(openai_endpoint.url, prompts, reset_prefix_cache=False, warmup=1, concurrencies=[1])
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert openai_endpoint.resets == [] and point.prefix_cache_reset is None
    assert len(point.warnings) == 1 and "the warm-up sends the file's first prompts" in point.warnings[0]


@pytest.mark.slow
def test_synthetic_workloads_need_no_warning(openai_endpoint, tokenizer, tmp_path):
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url, prompt_lens=[8], output_lens=[2], concurrencies=[1, 2]
    )
    config.load.num_requests = 2
    points = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert [p.warnings for p in points] == [[], []]  # fresh prompts at every point, and for its warm-up
