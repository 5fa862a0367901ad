"""A sweep recipe: a TOML file with [target], [[serve]], [workload] and [load] tables (see recipes/*.toml)
read into a BenchConfig. A key the recipe leaves out keeps BenchConfig's default; a key it misspells is
an error naming the file, not a setting silently ignored."""

from __future__ import annotations

from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import check_server_name
from llmopt.bench.servers.quantized_serve import parse_quantize
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.bench.sweep.habit import Habit
from llmopt.files import read_toml

# {table: {recipe key: BenchConfig field}}
TABLES: dict[str, dict[str, str]] = {
    "target": {
        "endpoint": "endpoint",
        "model": "model",
        "api_key": "api_key",
        "api": "api",
        "quantized_cache": "quantized_cache",
    },
    "workload": {
        "kind": "workload",
        "prompt_len": "prompt_lens",
        "output_len": "output_lens",
        "prefix_len": "prefix_len",
        "num_prefixes": "num_prefixes",
        "dataset": "dataset",
        "turns": "turns",
        "turn_len": "prompt_lens",  # a multi-turn workload's prompt length: give one of the two
        "system_len": "system_len",
        "prompt_len_spread": "prompt_len_spread",
        "trace": "trace",
        "trace_block_size": "trace_block_size",
        "tools": "agent_tools",
    },
    "load": {
        "concurrency": "concurrencies",
        "request_rate": "request_rates",
        "arrival": "arrival",
        "max_concurrency": "max_concurrency",
        "num_requests": "num_requests",
        "max_seconds": "max_seconds",
        "warmup": "warmup",
        "slo": "slo",
        "max_error_rate": "max_error_rate",
        "request_timeout": "request_timeout",
        "connection_reuse": "connection_reuse",
        "sessions": "sessions",
        "think_time": "think_time",
        "burstiness": "burstiness",
        "ramp_up": "ramp_up",
        "stream": "streams",
        "reset_prefix_cache": "reset_prefix_cache",
        "goodput_search": "goodput_search",
        "search_percentile": "search_percentile",
        "search_tolerance": "search_tolerance",
        "num_runs": "num_runs",
        "rounds": "rounds",
        "workers": "workers",
        "metrics_interval": "metrics_interval",
        "replay_speed": "replay_speeds",
        "stop_on_saturation": "stop_on_saturation",
    },
}
# Fields that hold one value per sweep axis: a recipe may give one number or a list.
LIST_FIELDS = {
    *("prompt_lens", "output_lens", "concurrencies", "request_rates", "sessions", "streams", "replay_speeds")
}
SERVE_KEYS = {"name", "model", "args", "quantize", "engine"}


def load_recipe(path: Path) -> BenchConfig:
    """The BenchConfig that the recipe at `path` describes; any problem is a BenchError naming it."""
    try:
        data = read_toml(path, "recipe")
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    unknown = set(data) - {*TABLES, "serve", "habit"}
    if unknown:
        raise BenchError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}")
    values: dict[str, object] = {"habits": _habits(path, data.get("habit", []))}
    for table, keys in TABLES.items():
        values.update(_table_values(path, table, data.get(table, {}), keys))
    return BenchConfig(**values, servers=_servers(path, data.get("serve", [])), recipe=str(path))


def _table_values(path: Path, table: str, body: object, keys: dict[str, str]) -> dict[str, object]:
    if not isinstance(body, dict):
        raise BenchError(f"{path}: [{table}] must be a table")
    unknown = set(body) - set(keys)
    if unknown:
        raise BenchError(
            f"{path}: unknown key(s) in [{table}]: {', '.join(sorted(unknown))} (known: {', '.join(keys)})"
        )
    if {"prompt_len", "turn_len"} <= set(body):
        raise BenchError(f"{path}: [{table}] gives prompt_len and turn_len, one setting: give one of them")
    values: dict[str, object] = {}
    for key, value in body.items():
        name = keys[key]
        values[name] = value if name not in LIST_FIELDS or isinstance(value, list) else [value]
    return values


def _servers(path: Path, entries: object) -> list[ServerSpec]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BenchError(f"{path}: [[serve]] must be an array of tables")
    servers = []
    for i, entry in enumerate(entries):
        unknown = set(entry) - SERVE_KEYS
        if unknown:
            raise BenchError(f"{path}: unknown key(s) in [[serve]] #{i + 1}: {', '.join(sorted(unknown))}")
        if not isinstance(entry.get("args", {}), dict):
            raise BenchError(f"{path}: [[serve]] #{i + 1}: args must be a table")
        name = entry.get("name", f"serve-{i}")
        try:
            check_server_name(name)
        except ValueError as exc:
            raise BenchError(f"{path}: [[serve]] #{i + 1}: {exc}") from None
        quantize = entry.get("quantize")
        if quantize is not None:
            try:
                parse_quantize(quantize)
            except ValueError as exc:
                raise BenchError(f"{path}: [[serve]] #{i + 1} ({name}): {exc}") from None
        engine = entry.get("engine", "llmopt")  # checked with the args by BenchConfig.validate
        servers.append(ServerSpec(name, entry.get("model"), entry.get("args", {}), quantize, engine))
    return servers


def _habits(path: Path, entries: object) -> list[Habit]:
    """The [[habit]] entries: each a `name` and the settings it changes (habit.py)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BenchError(f"{path}: [[habit]] must be an array of tables")
    habits = []
    for i, entry in enumerate(entries):
        settings = {k: v for k, v in entry.items() if k != "name"}
        habit = Habit(entry.get("name", f"habit-{i}"), settings)
        try:
            habit.check()
        except ValueError as exc:
            raise BenchError(f"{path}: [[habit]] #{i + 1}: {exc}") from None
        habits.append(habit)
    return habits
