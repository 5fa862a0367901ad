"""llmopt's serve options as `llmopt serve` takes them, for a server started in a process of its own (the
bench's): one more engine beside vllm.py and llama_cpp.py. Every option is a flag of the same name, but
the API key, which goes in the environment; the parallel sizes have no equivalent (one machine)."""

from __future__ import annotations

import dataclasses
import json
import sys

from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.options import API_KEY_ENV, ServeOptions, flag, refuse_unmapped

ENGINE = "llmopt"
PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
MAPPED = {f.name for f in dataclasses.fields(ServeOptions)} - set(PARALLEL)


def llmopt_command(options: ServeOptions, python: str) -> EngineCommand:
    """`python -m llmopt.cli serve` with every option set away from its default (the host too)."""
    refuse_unmapped(options, ENGINE, MAPPED)
    flags = [options.model] if options.model else []
    changed = ["host"] * (options.host != ServeOptions.host) + options.changed()
    for name in changed:
        if name != "api_key":  # in the environment (api_key_env)
            flags += option_flags(name, getattr(options, name))
    env, secret = api_key_env(options.api_key)
    return EngineCommand(ENGINE, llmopt_serve_argv(options.port, flags, python), env, secret)


def option_flags(name: str, value: object) -> list[str]:
    """One option as `llmopt serve` reads it: True -> --flag, False -> --no-flag, a table as JSON."""
    if value is True:
        return [flag(name)]
    if value is False:
        return ["--no-" + flag(name)[2:]]
    return [flag(name), json.dumps(value) if isinstance(value, (dict, list)) else str(value)]


def llmopt_serve_argv(port: int, flags: list[str], python: str = sys.executable) -> list[str]:
    """`llmopt serve` on `port` with `flags` (the model first, if any), run by `python` (ours)."""
    return [python, "-m", "llmopt.cli", "serve", "--port", str(port), *flags]


def api_key_env(api_key: str | None) -> tuple[dict[str, str], set[str]]:
    """The key in $LLMOPT_API_KEY (a command line is readable by every user of the machine, an
    environment is not), and that name secret: never shown, and never inherited from ours."""
    return ({API_KEY_ENV: api_key} if api_key else {}), {API_KEY_ENV}


def llmopt_environment(api_key: str | None) -> dict[str, str]:
    """A local `llmopt serve`'s environment: ours with `api_key` or, whatever ours holds, no key at all,
    so that the server asks for exactly the key its client sends."""
    env, secret = api_key_env(api_key)
    return EngineCommand(ENGINE, [], env, secret).environment()


def unsupported(options: ServeOptions, engine_python: str | None) -> str | None:
    """Why `llmopt serve` on its own engine refuses these options (a usage error), or None."""
    parallel = [flag(name) for name in PARALLEL if getattr(options, name) != 1]
    given = parallel + ["--engine-python"] * bool(engine_python)
    if given:
        return f"{', '.join(given)}: llmopt's engine runs on one machine; use --engine vllm"
    return None
