"""`llmopt bench` as a user runs it against the session's live `llmopt serve` (the real model): the
multi-turn and agent workloads, their counts checked against the server's own /metrics, and the prefix
cache reset between points. Small on purpose: 2 sessions of 2 turns, a few output tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import API_KEY


def bench(server, tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    command = [sys.executable, "-m", "llmopt.cli", "bench", "--endpoint", server.url + "/v1"]
    command += ["--api-key", API_KEY, "--results-dir", str(tmp_path), "--run-name", name, "--warmup", "0"]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=600)
    summary = tmp_path / name / "summary.json"
    points = json.loads(summary.read_text())["points"] if summary.is_file() else []
    return result, points


def grew(before: dict, after: dict, name: str) -> float:
    return after[f"llmopt:{name}"] - before[f"llmopt:{name}"]


SESSIONS = ("--sessions", "2", "--turns", "2", "--num-requests", "4", "--output-len", "4")


def test_multi_turn_counts_equal_the_servers_metrics_and_later_turns_hit_the_cache(server, tmp_path):
    before = server.metrics()
    args = ("--workload", "multi-turn", *SESSIONS, "--system-len", "32", "--turn-len", "16")
    result, [point] = bench(server, tmp_path, "mt", *args)
    after = server.wait_idle()
    assert result.returncode == 0, result.stderr + result.stdout
    assert point["successful"] == grew(before, after, "request_success_total") == 4
    assert point["output_tokens"] == grew(before, after, "generation_tokens_total") == 4 * 4
    assert point["prompt_tokens"] == grew(before, after, "prompt_tokens_total")
    first, second = point["turns"]
    assert first["successful"] == second["successful"] == 2
    # The second turn replays the first (and its answer): longer, and mostly served from the cache.
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"] + 16
    assert second["cached_fraction"] > max(first["cached_fraction"], 0.3)
    assert point["conversations"]["completed"] == 2 and point["prefix_cache_reset"] is True


def test_agent_counts_equal_the_servers_metrics_with_tools_or_without(server, tmp_path):
    before = server.metrics()
    result, [point] = bench(
        server, tmp_path, "agent", "--workload", "agent", *SESSIONS, "--turn-len", "12", "--system-len", "64"
    )
    after = server.wait_idle()
    assert result.returncode == 0, result.stderr + result.stdout
    # A server without tool support refuses them (400, served nothing): the turns then carry them as text.
    assert point["tools"] == "sent" or point["tools"].startswith("refused by the server (HTTP 400")
    assert point["successful"] == grew(before, after, "request_success_total") == 4 and point["failed"] == 0
    assert point["output_tokens"] == grew(before, after, "generation_tokens_total") == 4 * 4
    assert point["prompt_tokens"] == grew(before, after, "prompt_tokens_total")
    assert point["conversations"]["completed"] == 2


def test_the_prefix_cache_is_reset_between_points(server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    words = "the quick brown fox jumps over the lazy dog while seven small birds sing in the old oak tree"
    lines = [{"prompt": f"{start} {words} {words}", "max_tokens": 2} for start in ("Once", "Later")]
    prompts.write_text("\n".join(json.dumps(line) for line in lines))
    args = ("--workload", "file", "--dataset", str(prompts), "--api", "completions", "--concurrency", "1,2")
    args += ("--num-requests", "2")
    reset, (_, second) = bench(server, tmp_path, "reset", *args)
    assert reset.returncode == 0, reset.stderr
    assert second["prefix_cache_reset"] is True and second["cached_tokens"] == 0 and second["warnings"] == []

    kept, (_, warm) = bench(server, tmp_path, "kept", *args, "--no-reset-prefix-cache")
    assert kept.returncode == 0, kept.stderr
    assert warm["cached_tokens"] > 0 and "sends the prompts of an earlier point" in warm["warnings"][0]
    assert "warning" in kept.stderr


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_agent_workload_through_each_api_counts_what_the_server_served(server, tmp_path, api):
    """`llmopt bench --api responses|messages`: the same agent sessions through the Responses API
    (turns chained by previous_response_id, the server keeping the history) and Anthropic's API; the
    tokens the records say (each API's usage) are the tokens the server served, and the later turns'
    prompts came from the prefix cache."""
    before = server.metrics()
    args = ("--workload", "agent", "--api", api, *SESSIONS, "--turn-len", "12", "--system-len", "64")
    result, [point] = bench(server, tmp_path, f"agent-{api}", *args)
    after = server.wait_idle()
    assert result.returncode == 0, result.stderr + result.stdout
    assert point["tools"] == "sent" and point["failed"] == 0
    assert point["successful"] == grew(before, after, "request_success_total") == 4
    assert point["output_tokens"] == grew(before, after, "generation_tokens_total") == 4 * 4
    assert point["prompt_tokens"] == grew(before, after, "prompt_tokens_total")
    assert point["token_source"] == "usage"
    first, second = point["turns"]
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"]
    assert second["cached_fraction"] > 0.3
    assert point["cached_tokens"] > 0
