"""Live `llmopt serve` processes on 127.0.0.1, started once per session and stopped by pid."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from llmopt.bench.launcher import LocalServer, llmopt_serve_command

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
