"""Live `llmopt serve` processes on 127.0.0.1, started once per session and stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "llmopt.cli", "serve", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not become healthy")

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

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def live_server(*args: str) -> Iterator[LiveServer]:
    server = LiveServer(*args)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(model_dir) -> Iterator[LiveServer]:
    """The main server: an API key and a small KV pool (48 blocks of 16 tokens)."""
    with live_server("--api-key", API_KEY, "--num-kv-blocks", "48", "--max-num-seqs", "32") as s:
        yield s


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
