"""The bench's settings (llmopt/bench/settings.py): each declared once, by its recipe table, and read from
a recipe by the key it declares; a setting written only in the dataclass still has its recipe key."""

from __future__ import annotations

import typing

from llmopt.bench.settings import TABLES, recipe_key, setting_fields, setting_name, setting_of, value_type
from llmopt.bench.sweep.bench_config import OWN, BenchConfig
from llmopt.bench.sweep.recipe import load_recipe


def given_value(annotation: object, default: object) -> object:
    """A value of the setting's type other than its default, as a recipe spells it."""
    base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    if typing.get_origin(annotation) in (list, tuple):
        return {int: [3, 5], float: [0.25, 0.5], bool: [False]}[typing.get_args(annotation)[0]]
    if base is bool:
        return not default
    return {str: "given", int: 7, float: 0.25}[base]


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_every_setting_has_one_name_a_help_and_a_default():
    names = [setting_name(f) for _, f in setting_fields()]
    assert len(names) == len(set(names)) and not set(names) & set(OWN)
    assert all(setting_of(f).help for _, f in setting_fields())
    assert BenchConfig().settings() == {
        setting_name(f): getattr(getattr(BenchConfig(), table), f.name) for table, f in setting_fields()
    }


def test_a_recipe_sets_every_setting_by_its_key(tmp_path):
    expected, lines = {}, []
    for table, settings in TABLES.items():
        lines.append(f"[{table}]")
        for f, default in ((f, getattr(settings(), f.name)) for _, f in setting_fields() if _ == table):
            value = given_value(value_type(settings, f), default)
            if isinstance(default, list):  # a sweep axis: one value stands for a list of it
                value = value[0]
            lines.append(f"{recipe_key(f)} = {toml_value(value)}")
            expected[setting_name(f)] = tuple(value) if isinstance(default, tuple) else value
            if isinstance(default, list):
                expected[setting_name(f)] = [value]
    path = tmp_path / "every.toml"
    path.write_text("\n".join(lines) + "\n")
    settings = load_recipe(path).settings()
    assert settings == expected
    assert all(settings[name] != value for name, value in BenchConfig().settings().items())
