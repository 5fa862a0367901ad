"""The `llmopt` command line: one module per command, each parses its options and calls one job."""

from __future__ import annotations

import typer

from llmopt.cli.bench import bench
from llmopt.cli.cost import cost
from llmopt.cli.evaluate import evaluate
from llmopt.cli.generate import generate
from llmopt.cli.quantize import quantize
from llmopt.cli.report import report
from llmopt.cli.serve import serve

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Quantize, serve and benchmark LLMs.")


@app.callback()
def root() -> None:
    """Quantize, serve and benchmark LLMs."""


for command in (generate, serve, bench, report, cost, quantize):
    app.command()(command)
app.command("eval")(evaluate)


def main() -> None:
    app()
