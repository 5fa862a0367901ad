"""How numbers read in every table llmopt prints or writes: the console's (cli/render.py) and the
report's (report/html.py) use these, so a figure looks the same in both."""

from __future__ import annotations


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def money(value) -> str:
    if value is None:
        return "-"
    return f"${value:,.6f}" if value < 0.01 else f"${value:,.4f}"


def break_even(row: dict) -> str:
    values = row.get("break_even_prompt_tokens")
    if not values:
        return "-"
    return "; ".join(
        f"{name}: {'any length' if v == 0 else f'> {v:,.0f} tokens'}" for name, v in values.items()
    )
