"""A peer as a foreground process (`llmopt serve --engine ...`): started through process.py, announced
once it answers its readiness route, SIGINT and SIGTERM passed on to it, stopped cleanly, and its exit
status returned."""

from __future__ import annotations

import signal
import sys

from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.process import ServerProcess


def run_foreground(command: EngineCommand, url: str, ready_timeout_s: float = 600) -> int:
    """Run `command` until it exits; `url` is where it listens. Returns its exit status (128 + N when a
    signal N ended it, as a shell reports it)."""
    server = ServerProcess.start(command.argv, command.environment())
    forwarded: list[int] = []

    def forward(signum: int, _frame) -> None:
        forwarded.append(signum)
        server.send(signum)

    # Process-wide, for as long as the peer runs: our Ctrl-C or SIGTERM is the peer's, so it stops
    # cleanly rather than being orphaned; the previous handlers come back in `finally`.
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        announce_ready(server, url + command.ready_path, ready_timeout_s, command.engine)
        server.proc.wait()  # a forwarded signal does not end the wait (PEP 475): the peer's exit does
    finally:
        server.stop(forwarded[-1] if forwarded else signal.SIGTERM)
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = server.returncode
    return 128 - code if code < 0 else code


def announce_ready(server: ServerProcess, url: str, timeout_s: float, engine: str) -> None:
    """Say on stderr once `url` answers; a peer that does not within `timeout_s` is stopped. A peer that
    exits first ends the wait."""
    if server.wait_ready(url, timeout_s):
        print(f"{engine} is ready at {url.rsplit('/', 1)[0]}/v1", file=sys.stderr, flush=True)
    elif server.running():
        print(f"{engine} did not answer {url} within {timeout_s:.0f} s; stopping it", file=sys.stderr)
        server.stop(signal.SIGTERM)
