"""`llmopt cost`: token-based vs request-based vs self-hosted cost for a request shape."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmopt.cli.options import fail


def cost(
    prompt_tokens: Annotated[float, typer.Option(help="prompt tokens per request")],
    output_tokens: Annotated[float, typer.Option(help="output tokens per request")],
    requests: Annotated[int, typer.Option(help="how many requests to price")] = 1000,
    request_throughput: Annotated[
        float | None, typer.Option(help="requests/s a self-hosted server sustains (prices gpu-hour models)")
    ] = None,
    pricing: Annotated[
        Path | None, typer.Option(help="pricing models (default: the bundled llmopt/pricing.toml)")
    ] = None,
) -> None:
    """Compare token-based, request-based and self-hosted pricing for a request shape, without a run."""
    from rich.table import Table

    from llmopt.pricing import cost_table, load_pricing
    from llmopt.report.html import break_even, money

    if prompt_tokens < 0 or output_tokens < 0 or requests < 1:
        raise fail("token counts must be >= 0 and --requests >= 1")
    try:
        rows = cost_table(load_pricing(pricing), prompt_tokens, output_tokens, requests, request_throughput)
    except ValueError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"{prompt_tokens:,.0f} prompt + {output_tokens:,.0f} output tokens per request")
    for col in (
        "pricing model",
        "kind",
        "$ / request",
        "$ / 1M output tokens",
        f"$ for {requests:,} requests",
        "break-even prompt length",
    ):
        table.add_column(
            col, justify="left" if col in ("pricing model", "kind", "break-even prompt length") else "right"
        )
    for r in rows:
        total = money(r["total"]) if r["total"] is not None else "- (give --request-throughput)"
        table.add_row(
            r["name"],
            r["kind"],
            money(r["per_request"]),
            money(r["per_1m_output_tokens"]),
            total,
            break_even(r),
        )
    Console(width=200).print(table)
