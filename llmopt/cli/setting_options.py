"""`llmopt bench`'s setting options, made from the settings' fields (bench/settings.py): each setting's
option with its name, help, type and default as the field declares them, and the way back from the
parsed options to settings by name. Every option defaults to None, "not given", so that a given value
overrides a recipe's even when it equals the default; the help shows the field's default."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape

from llmopt.bench.settings import (
    TABLES,
    is_axis,
    option_name,
    setting_fields,
    setting_name,
    setting_of,
    value_type,
)
from llmopt.cli.shared_options import float_list, int_list


@dataclass(frozen=True)
class SettingOption:
    """One option of a setting: its parameter's name, the setting it gives, and how its value is read."""

    parameter: inspect.Parameter
    flag: str  # "num-requests"
    setting: str
    parse: Callable[[Any], object]
    alias_of: str | None = None  # an alias's "the multi-turn name of --prompt-len"


def setting_options() -> list[SettingOption]:
    """Every setting's option, and one more for each alias, table by table."""
    options = []
    for table, f in setting_fields():
        settings = TABLES[table]
        kind, parse = option_kind(value_type(settings, f), is_axis(settings, f))
        meta, name, flag = setting_of(f), setting_name(f), option_name(f)
        default = shown_default(f, flag)
        info = option_info(kind, flag, meta.help, table, default, meta.envvar)
        options.append(SettingOption(parameter(name, kind, info), flag, name, parse))
        for alias, what in meta.aliases.items():
            alias_flag = alias.replace("_", "-")
            alias_of = f"{what} of --{flag}"
            info = option_info(kind, alias_flag, alias_of, table, None, None)
            options.append(SettingOption(parameter(alias, kind, info), alias_flag, name, parse, alias_of))
    return options


def option_kind(annotation: Any, axis: bool) -> tuple[type, Callable[[Any], object]]:
    """The option's type and how its value becomes the setting's: a sweep axis of numbers is a
    comma-separated list ("1,4,16"; "" is none given), of booleans one flag ([given]); a tuple of
    numbers is a comma-separated list too; anything else is read as it is."""
    args = typing.get_args(annotation)
    if axis or typing.get_origin(annotation) is tuple:
        element = args[0]
        if element is bool:
            return bool, lambda given: [given]
        numbers = int_list if element is int else float_list
        make = list if axis else tuple
        return str, lambda text: make(numbers(text)) or None
    scalar = next((a for a in args if a is not type(None)), annotation)
    return scalar, lambda given: given


def shown_default(f: dataclasses.Field, flag: str) -> str | None:
    """The field's default as the help shows it; None for none (None, an empty list)."""
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if isinstance(default, (list, tuple)):
        if not default:
            return None
        if all(isinstance(v, bool) for v in default):
            [default] = default
        else:
            return ",".join(f"{v:g}" for v in default)
    if isinstance(default, bool):
        return flag if default else f"no-{flag}"
    if isinstance(default, float):
        return f"{default:g}"
    return None if default is None else str(default)


def option_info(
    kind: type, flag: str, help: str, table: str, default: str | None, envvar: str | None
) -> typer.models.OptionInfo:
    names = f"--{flag}/--no-{flag}" if kind is bool else f"--{flag}"
    return typer.Option(
        names,
        # Typer would show a default given as text in parentheses; and help texts quote "[true, false]",
        # which rich would read as markup.
        help=escape(help if default is None else f"{help} [default: {default}]"),
        show_default=False,
        envvar=envvar,
        rich_help_panel=f"{table.capitalize()} (a recipe's [{table}] table)".replace("[", "\\["),
    )


def parameter(name: str, kind: type, info: typer.models.OptionInfo) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, info]
    )


def with_setting_options(command: Callable) -> Callable:
    """`command`, whose own options are keyword-only and which takes the settings as **keyword
    arguments, with a parameter for each setting's option after `recipe`: what Typer reads."""
    own = [
        p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD
    ]
    at = next(i for i, p in enumerate(own) if p.name == "recipe") + 1
    command.__signature__ = inspect.Signature([*own[:at], *(o.parameter for o in SETTING_OPTIONS), *own[at:]])
    return command


def settings_from_options(options: dict[str, object]) -> dict[str, object]:
    """{setting name: value} of the parsed `options` (None: not given); a ValueError for one setting
    given by two of its names."""
    settings: dict[str, object] = {}
    given_as: dict[str, SettingOption] = {}
    for option in SETTING_OPTIONS:
        value = options[option.parameter.name]
        if value is None:
            settings.setdefault(option.setting, None)
            continue
        if option.setting in given_as:
            alias = option if option.alias_of else given_as[option.setting]
            raise ValueError(f"--{alias.flag} is {alias.alias_of}: give one of them")
        given_as[option.setting] = option
        settings[option.setting] = option.parse(value)
    return settings


SETTING_OPTIONS = setting_options()
