"""A sweep recipe: a TOML file with [target], [[serve]], [workload], [load] and [[habit]] tables (see
recipes/*.toml) read into a BenchConfig. Each table's keys are its settings' recipe keys (settings.py); a
key the recipe leaves out keeps the setting's default, and a key it misspells is an error naming the
file, not a setting silently ignored."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import check_server_name
from llmopt.bench.servers.quantized_serve import parse_quantize
from llmopt.bench.settings import TABLES, is_axis, recipe_key, setting_of
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.bench.sweep.habit import Habit
from llmopt.files import read_toml

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
    tables = {name: table_settings(path, name, data.get(name, {})) for name in TABLES}
    servers, habits = _servers(path, data.get("serve", [])), _habits(path, data.get("habit", []))
    return BenchConfig(**tables, servers=servers, habits=habits, recipe=str(path))


def table_settings(path: Path, name: str, body: object) -> object:
    """The recipe's [name] table as that table's settings (settings.py)."""
    if not isinstance(body, dict):
        raise BenchError(f"{path}: [{name}] must be a table")
    table = TABLES[name]
    fields = {recipe_key(f): f for f in dataclasses.fields(table)}
    aliases = {alias: f for f in fields.values() for alias in setting_of(f).aliases}
    unknown = set(body) - set(fields) - set(aliases)
    if unknown:
        known = ", ".join([*fields, *aliases])
        raise BenchError(f"{path}: unknown key(s) in [{name}]: {', '.join(sorted(unknown))} (known: {known})")
    values: dict[str, object] = {}
    for key, value in body.items():
        f = fields.get(key) or aliases[key]
        if f.name in values:
            given = " and ".join(k for k in [recipe_key(f), *setting_of(f).aliases] if k in body)
            raise BenchError(f"{path}: [{name}] gives {given}, one setting: give one of them")
        values[f.name] = recipe_value(table, f, value)
    return table(**values)


def recipe_value(table: type, f: dataclasses.Field, value: object) -> object:
    """A recipe's value as its field holds it: a sweep axis from one value or a list of them, a tuple
    (the percentiles) from a list; any other as it is (validate judges it)."""
    if is_axis(table, f) and not isinstance(value, list):
        return [value]
    if isinstance(f.default, tuple) and isinstance(value, list):
        return tuple(value)
    return value


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
