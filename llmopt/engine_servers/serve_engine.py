"""`llmopt serve --engine vllm|llama.cpp`: build the peer's command, show it (--dry-run) or run it."""

from __future__ import annotations

from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.foreground import run_foreground
from llmopt.engine_servers.options import ServeOptions
from llmopt.engine_servers.peers import peer
from llmopt.engine_servers.python import find_python


def engine_command(
    engine: str, options: ServeOptions, python: str | None = None, check: bool = True
) -> EngineCommand:
    """The command that serves `options` on `engine` (an EngineError says what cannot). The flags are
    translated first, so a flag the engine lacks is named whether or not the engine is installed."""
    chosen = peer(engine)
    command = chosen.command(options, find_python(chosen, python, check=False))
    if check:
        command.argv[0] = find_python(chosen, python)
    return command


def serve_engine(engine: str, options: ServeOptions, python: str | None, dry_run: bool) -> int:
    """Print the command (--dry-run: 0) or run it in the foreground; the exit status to exit with."""
    command = engine_command(engine, options, python, check=not dry_run)
    if dry_run:
        print(command.shown())
        return 0
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    return run_foreground(command, f"http://{host}:{options.port}")
