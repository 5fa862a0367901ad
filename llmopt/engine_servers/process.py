"""A server in a child process, whichever engine it runs: started with its environment (its output to a
log when the caller keeps one), polled on its readiness route until it answers, and stopped with a
signal, then SIGKILL once the grace period is over. `llmopt serve --engine ...` (foreground.py) and the
bench (bench/servers/launcher.py) both start their servers through it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import IO

import httpx

STOP_TIMEOUT_S = 30  # after the stopping signal, then SIGKILL


@dataclass
class ServerProcess:
    proc: subprocess.Popen

    @classmethod
    def start(
        cls, argv: list[str], env: dict[str, str] | None = None, log: IO | None = None
    ) -> ServerProcess:
        """`argv` with `env` (None: ours); stdout and stderr into `log`, or ours when None."""
        stderr = subprocess.STDOUT if log is not None else None
        return cls(subprocess.Popen(argv, env=env, stdout=log, stderr=stderr))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, url: str, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Poll `url` until it answers 200 (True); False once the process has exited or `timeout_s`
        passed without an answer (the caller says which, and stops it). One client for every poll: a new
        one each time (httpx.get) costs tens of milliseconds of CPU, which at a 20 ms poll took most of a
        core from the server starting beside it (later starts measured at 9.5-10.5 s, 6.4 s by curl)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline and self.running():
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return True
                time.sleep(poll_s)
        return False

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it exited in between
            self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send `signum` to a running process and wait `timeout_s` for it, then SIGKILL; its exit status."""
        if self.running():
            self.send(signum)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
