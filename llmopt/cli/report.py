"""`llmopt report`: one self-contained HTML report for bench runs; with --fail-if, a CI verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from llmopt.cli import render
from llmopt.cli.shared_options import console, fail

FAIL_IF_HELP = (
    "e.g. 'ttft_p99>+10%,output_throughput<-5%': exit 1 when a condition holds at any point of a later "
    "run matched in the first (latencies judged by a 95 % bootstrap interval of the change)"
)


def report(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="bench run folders (results/<run>); several are overlaid")
    ],
    out: Annotated[Path, typer.Option(help="the HTML file to write")] = Path("report.html"),
    pricing: Annotated[
        Path | None, typer.Option(help="pricing models (default: the bundled llmopt/pricing.toml)")
    ] = None,
    fail_if: Annotated[str | None, typer.Option(help=FAIL_IF_HELP)] = None,
) -> None:
    """Write one self-contained HTML report (plots inlined) for one or more bench runs."""
    from llmopt.report.html import load_runs, write
    from llmopt.report.verdict import parse_conditions, verdict

    try:
        conditions = parse_conditions(fail_if) if fail_if is not None else None
    except ValueError as exc:
        raise fail(str(exc), code=2) from None  # 1 is the verdict: a usage error must differ
    try:
        runs = load_runs(run_dirs)
        checks = verdict(runs, conditions) if conditions else None
        path = write(runs, out, pricing, checks)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    console.print(f"report: {path}")
    if checks is None:
        return
    if len(runs) < 2 or not checks:
        raise fail("--fail-if compares later runs with the first: no point matched", code=2)
    Console(width=200).print(render.verdict_table(checks))  # stdout: a CI log or a file keeps it
    failed = [c for c in checks if c.holds]
    if failed:
        console.print(f"[red]FAIL[/red]: {len(failed)} of {len(checks)} check(s) hold")
        raise typer.Exit(code=1)
    console.print(f"ok: none of {len(checks)} check(s) holds")
