"""`llmopt bench`'s setting options, made from the settings' fields: every setting has its option, the
option sets it, and the help shows the field's default."""

from __future__ import annotations

import typing

import pytest
import typer

from llmopt.bench.settings import TABLES, option_name, setting_fields, setting_name, setting_of, value_type
from llmopt.bench.sweep.bench_config import BenchConfig, with_overrides
from llmopt.cli import app
from llmopt.cli.setting_options import settings_from_options


def bench_command() -> typer.core.TyperCommand:
    return typer.main.get_command(app).commands["bench"]


def given(table: str, f) -> tuple[list[str], object]:
    """Arguments that give the setting a value other than its default, and that value."""
    annotation, default = value_type(TABLES[table], f), getattr(TABLES[table](), f.name)
    flag = f"--{option_name(f)}"
    element = typing.get_args(annotation)[0] if typing.get_origin(annotation) in (list, tuple) else None
    if element is bool or annotation == "bool" or isinstance(default, bool):
        on = default != [True] and default is not True
        return [flag if on else f"--no-{option_name(f)}"], [on] if element is bool else on
    if element is not None:
        return [flag, "3,5"], (tuple if isinstance(default, tuple) else list)(element(v) for v in (3, 5))
    base = next(a for a in typing.get_args(annotation) + (annotation,) if a is not type(None))
    text = {str: "given", int: "7", float: "0.25"}[base]
    return [flag, text], base(text)


@pytest.mark.parametrize(("table", "f"), list(setting_fields()), ids=lambda x: getattr(x, "name", x))
def test_every_settings_option_sets_it(table, f, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    args, value = given(table, f)
    params = bench_command().make_context("bench", args).params
    config = with_overrides(BenchConfig(), settings_from_options(params))
    assert config.settings()[setting_name(f)] == value
    assert {name for name, v in config.settings().items() if v != BenchConfig().settings()[name]} == {
        setting_name(f)
    }


def test_the_help_shows_each_settings_default_from_its_field():
    options = {opt: p for p in bench_command().params for opt in p.opts}
    for table, f in setting_fields():
        option = options[f"--{option_name(f)}"]
        assert setting_of(f).help in option.help.replace("\\[", "[")
        default = getattr(TABLES[table](), f.name)
        if default in (None, []):
            assert "[default:" not in option.help
        elif isinstance(default, (int, str)) and not isinstance(default, bool):
            assert option.help.endswith(f"[default: {default}]")
    assert options["--num-requests"].help.endswith("[default: 64]")
    assert options["--percentiles"].help.endswith("[default: 50,90,99]")
    assert options["--stream"].help.endswith("[default: stream]")
    assert options["--stop-on-saturation"].help.endswith("[default: no-stop-on-saturation]")
    assert options["--request-timeout"].help.endswith("[default: 600]")
