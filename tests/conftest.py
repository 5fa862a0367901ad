"""Session-wide fixtures: one engine on the real default model, its transformers reference, and one live
`llmopt serve` on 127.0.0.1 (started once, stopped by pid)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from llmopt.bench.launcher import LocalServer, llmopt_serve_command
from llmopt.engine.llm import LLM
from llmopt.models import resolve_model

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


@pytest.fixture(scope="session")
def model_dir():
    return resolve_model()


@pytest.fixture(scope="session")
def llm(model_dir) -> LLM:
    return LLM(str(model_dir), num_kv_blocks=512)


@pytest.fixture(scope="session")
def hf_greedy(model_dir, llm):
    """transformers' own greedy decode (batch 1), cut at the first token the engine treats as EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
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


API_KEY = "test-key"


class LiveServer(LocalServer):
    """`llmopt serve` with the helpers tests need to look inside it."""

    def __init__(self, *args: str):
        super().__init__(lambda port: llmopt_serve_command(port, list(args)), ready_timeout_s=180)

    def metrics(self) -> dict[str, float]:
        """The server's /metrics as {name: value} (label sets dropped; one model per server)."""
        values: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = float(value)
        return values

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
    """The main server: an API key and a small KV pool (48 blocks of 16 tokens)."""
    with LiveServer("--api-key", API_KEY, "--num-kv-blocks", "48", "--max-num-seqs", "32") as s:
        yield s


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
