"""A peer as a foreground process: started with its environment, announced once it answers its
readiness route, SIGINT and SIGTERM passed on to it, stopped cleanly, and its exit status returned."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import httpx

from llmopt.engines.command import EngineCommand

STOP_TIMEOUT_S = 30  # after a forwarded signal, then SIGKILL


def run_foreground(command: EngineCommand, url: str, ready_timeout_s: float = 600) -> int:
    """Run `command` until it exits; `url` is where it listens. Returns its exit status (128 + N when a
    signal N ended it, as a shell reports it)."""
    proc = subprocess.Popen(command.argv, env=command.environment())
    forwarded: list[int] = []

    def forward(signum: int, _frame) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        wait_ready(proc, url + command.ready_path, ready_timeout_s, command.engine)
        proc.wait()  # a forwarded signal does not end the wait (PEP 475): the peer's exit does
    finally:
        if proc.poll() is None:
            stop(proc, forwarded[-1] if forwarded else signal.SIGTERM)
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = proc.returncode
    return 128 - code if code < 0 else code


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, engine: str) -> None:
    """Poll `url` until it answers 200; say so on stderr. A process that exits first ends the wait."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                print(f"{engine} is ready at {url.rsplit('/', 1)[0]}/v1", file=sys.stderr, flush=True)
                return
        time.sleep(0.5)
    if proc.poll() is None:
        print(f"{engine} did not answer {url} within {timeout_s:.0f} s; stopping it", file=sys.stderr)
        stop(proc, signal.SIGTERM)


def stop(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signum)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
