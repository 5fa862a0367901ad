"""`llmopt report`: one self-contained HTML report for bench runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.options import console, fail


def report(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="bench run folders (results/<run>); several are overlaid")
    ],
    out: Annotated[Path, typer.Option(help="the HTML file to write")] = Path("report.html"),
    pricing: Annotated[
        Path | None, typer.Option(help="pricing models (default: the bundled llmopt/pricing.toml)")
    ] = None,
) -> None:
    """Write one self-contained HTML report (plots inlined) for one or more bench runs."""
    from llmopt.report.html import write_report

    try:
        path = write_report(run_dirs, out, pricing)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    console.print(f"report: {path}")
