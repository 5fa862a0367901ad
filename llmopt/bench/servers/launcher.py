"""Start a server process on a free local port, wait until /health answers, stop it by its pid
(SIGTERM, then SIGKILL) — also when the caller is interrupted. The process itself is
engine_servers/process.py's; this adds the port, the log and the bench's errors."""

from __future__ import annotations

import signal
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from llmopt.engine_servers.llmopt import llmopt_serve_argv
from llmopt.engine_servers.process import STOP_TIMEOUT_S, ServerProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """A server process on 127.0.0.1. `command(port)` builds its command line; its output goes to a log."""

    def __init__(
        self,
        command: Callable[[int], list[str]],
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
        self.process = ServerProcess.start(command(self.port), env, self._log)
        self.proc = self.process.proc

    @property
    def pid(self) -> int:
        """The server's process: what the bench reads its CPU time from (machine_meter.py)."""
        return self.process.pid

    def wait_ready(self) -> LocalServer:
        if self.process.wait_ready(self.url + "/health", self.ready_timeout_s, poll_s=0.2):
            return self
        exited = not self.process.running()
        tail = self.log_tail()
        self.stop()
        if exited:
            raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{tail}")
        raise RuntimeError(f"the server did not answer /health within {self.ready_timeout_s:.0f} s:\n{tail}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        code = self.process.stop(sig, timeout_s)
        self._log.close()
        if self._temporary_log:
            self.log_path.unlink(missing_ok=True)
        return code

    def __enter__(self) -> LocalServer:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def llmopt_server(
    flags: list[str],
    ready_timeout_s: float = 300,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> LocalServer:
    """A local `llmopt serve` with `flags` (the model first, if any), started by this Python: what the
    benchmarks start beside their subjects, written once here instead of in each script."""
    return LocalServer(lambda port: llmopt_serve_argv(port, flags), ready_timeout_s, log_path, env)
