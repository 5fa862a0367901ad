"""Start a server process on a free local port, wait until /health answers, stop it by its pid
(SIGTERM, then SIGKILL) — also when the caller is interrupted."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


API_KEY_ENV = "LLMOPT_API_KEY"  # where `llmopt serve` reads its API key


def llmopt_serve_command(port: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "llmopt.cli", "serve", "--port", str(port), *args]


def llmopt_serve_env(api_key: str | None) -> dict[str, str]:
    """The environment of a local `llmopt serve`: ours, with `api_key` in $LLMOPT_API_KEY (a command
    line is readable by every user of the machine, an environment is not), or no key at all, whatever
    our own environment holds, so that the server asks for exactly the key the bench sends."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    if api_key:
        env[API_KEY_ENV] = api_key
    return env


class LocalServer:
    """A server process on 127.0.0.1. `command(port)` builds its command line; its output goes to a log."""

    def __init__(
        self,
        command,
        ready_timeout_s: float = 300,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        self._temporary_log = log_path is None  # removed on stop; a caller's log is kept
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="llmopt-server-", suffix=".log")[1])
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command(self.port), stdout=self._log, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        """The server's process: what the bench reads its CPU time from (machine_meter.py)."""
        return self.proc.pid

    def wait_ready(self) -> LocalServer:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {self.ready_timeout_s:.0f} s:\n{tail}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._temporary_log:
            self.log_path.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> LocalServer:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
