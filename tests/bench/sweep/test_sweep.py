"""`llmopt bench` as a user runs it (a subprocess) against real servers on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmopt.bench.servers.launcher import free_port
from tests.conftest import API_KEY, LiveServer


def bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmopt.cli", "bench", *args]


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(bench_cmd(*args), capture_output=True, text=True, timeout=timeout)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]


def points(run: Path) -> list[dict]:
    return json.loads((run / "summary.json").read_text())["points"]


def test_counts_equal_the_servers_own_metrics(server, tmp_path):
    before = server.metrics()
    run = tmp_path / "run"
    result = bench(
        "--endpoint",
        server.url + "/v1",
        "--api-key",
        API_KEY,
        "--concurrency",
        "2,4",
        "--num-requests",
        "6",
        "--prompt-len",
        "32",
        "--output-len",
        "8",
        "--warmup",
        "0",
        "--results-dir",
        str(tmp_path),
        "--run-name",
        "run",
        "--api",
        "completions",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    after = server.wait_idle()
    pts = points(run)
    assert [p["load"] for p in pts] == ["concurrency=2", "concurrency=4"]
    assert sum(p["successful"] for p in pts) == 12
    assert after["llmopt:request_success_total"] - before["llmopt:request_success_total"] == 12
    gen = after["llmopt:generation_tokens_total"] - before["llmopt:generation_tokens_total"]
    assert sum(p["output_tokens"] for p in pts) == gen == 12 * 8
    prompt = after["llmopt:prompt_tokens_total"] - before["llmopt:prompt_tokens_total"]
    assert sum(p["prompt_tokens"] for p in pts) == prompt
    recs = records(run)
    # A streamed chunk may carry several tokens (the server verifies prompt-lookup proposals by default),
    # so a request of 8 tokens has at most 7 gaps between chunks.
    assert len(recs) == 12 and all(r["tokens_from"] == "usage" and 1 <= len(r["itl"]) <= 7 for r in recs)
    assert "concurrency=4" in result.stdout and (run / "summary.csv").read_text().count("\n") == 3


def test_interrupt_keeps_records_and_resume_finishes(server, tmp_path):
    args = [
        "--endpoint",
        server.url + "/v1",
        "--api-key",
        API_KEY,
        "--concurrency",
        "1,2",
        "--num-requests",
        "4",
        "--prompt-len",
        "16",
        "--output-len",
        "24",
        "--warmup",
        "0",
        "--results-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    run = tmp_path / "r"
    # Ctrl-C reaches the bench as in a terminal even when the suite runs as a background job (whose
    # shell starts it with SIGINT ignored, a disposition children inherit and Python then keeps).
    proc = subprocess.Popen(
        bench_cmd(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while not (run / "summary.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err + out
    assert "--resume" in out + err and "Traceback" not in err
    assert len(points(run)) == 1
    first = [r for r in records(run) if r["point"].endswith("concurrency=1")]
    assert len(first) == 4 and all(r["success"] for r in first)

    again = bench(*args)
    assert again.returncode == 1 and "already holds a run" in again.stderr
    resumed = bench(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [p["load"] for p in points(run)] == ["concurrency=1", "concurrency=2"]
    recs = records(run)
    assert len(recs) == 8 and sum(r["point"].endswith("concurrency=1") for r in recs) == 4


def test_endpoint_that_dies_mid_run(model_dir, tmp_path):
    dying = LiveServer("--max-num-seqs", "2").wait_ready()
    run = tmp_path / "d"
    proc = subprocess.Popen(
        bench_cmd(
            "--endpoint",
            dying.url + "/v1",
            "--concurrency",
            "2",
            "--num-requests",
            "40",
            "--prompt-len",
            "16",
            "--output-len",
            "32",
            "--warmup",
            "0",
            "--results-dir",
            str(tmp_path),
            "--run-name",
            "d",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (run / "requests.jsonl").is_file() and len(records(run)) >= 3:
                break
            time.sleep(0.1)
        dying.stop(signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        dying.stop()
    assert proc.returncode == 1
    assert "failed" in out + err and "Traceback" not in err
    [point] = points(run)
    assert point["successful"] >= 3 and point["failed"] >= 1
    assert point["successful"] + point["failed"] == len(records(run)) == 40


def test_refused_connection_and_bad_key_are_counted_not_raised(server, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    no_model = bench("--endpoint", dead, "--results-dir", str(tmp_path))
    assert no_model.returncode == 1 and "cannot list models" in no_model.stderr
    assert "Traceback" not in no_model.stderr

    refused = bench(
        "--endpoint",
        dead,
        "--model",
        "m",
        "--num-requests",
        "40",
        "--warmup",
        "0",
        "--prompt-len",
        "8",
        "--output-len",
        "4",
        "--max-error-rate",
        "0.2",
        "--results-dir",
        str(tmp_path),
        "--run-name",
        "x",
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    [point] = points(tmp_path / "x")
    assert point["successful"] == 0 and "ClientConnectorError" in point["errors"][0]
    assert point["stopped_early"] and point["requests"] < 40  # --max-error-rate stopped the point

    wrong_key = bench(
        "--endpoint",
        server.url + "/v1",
        "--model",
        "smollm2-135m",
        "--api-key",
        "nope",
        "--num-requests",
        "3",
        "--warmup",
        "0",
        "--prompt-len",
        "8",
        "--output-len",
        "4",
        "--results-dir",
        str(tmp_path),
        "--run-name",
        "k",
    )
    assert wrong_key.returncode == 1
    [point] = points(tmp_path / "k")
    assert point["failed"] == 3 and point["errors"][0].startswith("HTTP 401")


def test_recipe_starts_and_stops_local_servers(model_dir, tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(
        """
[[serve]]
name = "tiny-pool"
args = { max-num-seqs = 2, num-kv-blocks = 64, enable-prefix-caching = false }

[workload]
prompt_len = [16]
output_len = [8]

[load]
concurrency = [2]
num_requests = 4
warmup = 1
"""
    )
    result = bench("--recipe", str(recipe), "--results-dir", str(tmp_path), "--run-name", "rec")
    assert result.returncode == 0, result.stderr + result.stdout
    [point] = points(tmp_path / "rec")
    assert point["server"] == "tiny-pool" and point["successful"] == 4
    assert point["server_args"]["num-kv-blocks"] == 64
    assert (tmp_path / "rec" / "server-tiny-pool.log").is_file()
    with pytest.raises(httpx.ConnectError):  # the server is gone
        httpx.get(point["endpoint"].removesuffix("/v1") + "/health", timeout=2)
