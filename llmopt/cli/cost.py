"""`llmopt cost`: what a workload costs under token, request, plan and self-hosted pricing, which is
the cheapest, and where they break even; for a request shape, or for a finished bench run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmopt.cli import render
from llmopt.cli.shared_options import fail

if TYPE_CHECKING:  # the cost model is imported when the command runs
    from llmopt.cost.conversation_shape import ConversationShape
    from llmopt.pricing import PricingModel

PricingOption = Annotated[
    Path | None, typer.Option(help="pricing models (default: the bundled llmopt/pricing.toml)")
]


def cost(
    prompt_tokens: Annotated[
        float | None, typer.Option(help="prompt tokens per request (with --turns: new tokens per turn)")
    ] = None,
    output_tokens: Annotated[float | None, typer.Option(help="output tokens per request")] = None,
    requests: Annotated[
        int, typer.Option(help="how many requests to price (with --turns: conversations)")
    ] = 1000,
    turns: Annotated[
        int, typer.Option(help="turns per conversation; each replays the history before its new tokens")
    ] = 1,
    cached_fraction: Annotated[
        float, typer.Option(help="share of every prompt read from the provider's cache (0 to 1)")
    ] = 0.0,
    utilisation: Annotated[
        float, typer.Option(help="share of a plan's daily request quota that is used (0 to 1]")
    ] = 1.0,
    request_throughput: Annotated[
        float | None, typer.Option(help="requests/s a self-hosted server sustains (prices gpu-hour models)")
    ] = None,
    run: Annotated[
        Path | None, typer.Option(help="price a finished bench run (results/<run>) request by request")
    ] = None,
    list_prices: Annotated[
        bool, typer.Option("--list", help="list the pricing models with their source and date")
    ] = False,
    pricing: PricingOption = None,
) -> None:
    """Compare token, request, plan and self-hosted pricing for a request shape or a bench run."""
    from llmopt.pricing import load_pricing

    if not 0 < utilisation <= 1:
        raise fail("--utilisation is the share of a plan's quota used: greater than 0, at most 1")
    try:
        models = load_pricing(pricing)
    except ValueError as exc:
        raise fail(str(exc)) from None
    console = Console(width=200)
    if list_prices:
        console.print(render.pricing_table(models))
    elif run is not None:
        for block in price_run(run, models, utilisation):
            show(console, block)
    else:
        if prompt_tokens is None or output_tokens is None:
            raise fail("give --prompt-tokens and --output-tokens, or --run RUN, or --list")
        if prompt_tokens < 0 or output_tokens < 0 or requests < 1 or turns < 1:
            raise fail("token counts must be >= 0, --requests and --turns >= 1")
        if not 0 <= cached_fraction <= 1:
            raise fail("--cached-fraction is between 0 and 1")
        from llmopt.cost.conversation_shape import ConversationShape

        shape = ConversationShape(prompt_tokens, output_tokens, turns, cached_fraction)
        show(console, price_shape(shape, models, requests, utilisation, request_throughput))


def show(console: Console, items: list) -> None:
    """Tables as they are; sentences on one line each, however long (a log or a grep keeps them whole)."""
    for item in items:
        console.print(item, soft_wrap=not isinstance(item, Table))


def price_shape(
    shape: ConversationShape,
    models: list[PricingModel],
    requests: int,
    utilisation: float,
    request_throughput: float | None,
) -> list:
    """What to print for `requests` conversations of `shape`: the bill, the answer, the break-evens."""
    from llmopt.cost.break_even import break_evens
    from llmopt.cost.workload import Workload, rank

    ranked = rank(models, Workload([shape.usages()], request_throughput), utilisation)
    out: list = [render.shape_bill_table(ranked, shape, requests)]
    out += render.answer(ranked, shape.turns > 1)
    rows = break_evens(models, shape, utilisation, request_throughput)
    if rows:
        out.append(render.break_even_table(rows, shape))
    return out


def price_run(run: Path, models: list[PricingModel], utilisation: float) -> list[list]:
    """What to print for a finished bench run: for each server config, its bill and the answer."""
    from llmopt.bench.rundir import RunDir
    from llmopt.cost.from_run import served_workloads
    from llmopt.cost.workload import rank

    folder = RunDir(run)
    try:
        if not folder.is_run():
            raise ValueError(f"{run} is not a bench run (no summary.json)")
        summary, records = folder.read_summary(), folder.read_records()
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    blocks = []
    for served in served_workloads(records, summary.points):
        if not served.workload.requests:
            blocks.append([f"{served.server}: no successful request to price"])
            continue
        ranked = rank(models, served.workload, utilisation)
        answer = render.answer(ranked, served.workload.multi_turn)
        blocks.append([render.run_bill_table(ranked, served, run.name), *answer])
    return blocks
