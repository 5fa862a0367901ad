"""`llmopt cost`: token-based vs request-based vs self-hosted cost for a request shape."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmopt.cli import render
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
    from llmopt.pricing import cost_table, load_pricing

    if prompt_tokens < 0 or output_tokens < 0 or requests < 1:
        raise fail("token counts must be >= 0 and --requests >= 1")
    try:
        rows = cost_table(load_pricing(pricing), prompt_tokens, output_tokens, requests, request_throughput)
    except ValueError as exc:
        raise fail(str(exc)) from None
    Console(width=200).print(render.cost_table(rows, prompt_tokens, output_tokens, requests))
