"""`llmopt bench`: load-test any OpenAI-compatible endpoint. Its setting options are made from the
settings' fields (setting_options.py); this module adds the run's own options, parses and calls."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.setting_options import settings_from_options, with_setting_options
from llmopt.cli.shared_options import fail

RecipeOption = Annotated[
    Path | None, typer.Option(help="a sweep recipe (TOML); flags given here override it")
]
RunNameOption = Annotated[str | None, typer.Option(help="folder under --results-dir; default: a timestamp")]
ResumeOption = Annotated[bool, typer.Option(help="continue an interrupted run (same --run-name)")]


@with_setting_options
def bench(
    *,
    recipe: RecipeOption = None,
    run_name: RunNameOption = None,
    results_dir: Path = Path("results"),
    resume: ResumeOption = False,
    **options: object,
) -> None:
    """Load-test any OpenAI-compatible endpoint (ours, vLLM, llama.cpp, a paid API)."""
    try:
        settings = settings_from_options(options)
    except ValueError as exc:
        raise fail(str(exc)) from None
    # Imported only now: the bench's client, aiohttp and the sweep are this command's imports alone
    # (they cost `llmopt serve`'s start-up 0.18 s).
    from llmopt.cli.bench_run import start_bench

    raise typer.Exit(start_bench(settings, recipe, run_name, results_dir, resume))
