"""The run of `llmopt bench` once its options are parsed: the sweep with progress bars, the results
table, the report. A module of its own so that every other command (`llmopt serve` above all, whose
start-up it cost 0.18 s) does not import the bench's client, aiohttp and the sweep."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.rundir import RECORDS, REPORT, SUMMARY_CSV, SUMMARY_JSON, RunDir, run_folder_name
from llmopt.bench.schema import PointSummary, RequestRecord
from llmopt.bench.sweep.bench_config import BenchConfig, with_overrides
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import ModelError, load_tokenizer, resolve_tokenizer
from llmopt.cli.render import client_warning, natural_width, results_table, turns_table
from llmopt.cli.shared_options import console, fail
from llmopt.report.machine_cost import cost_source_lines


def start_bench(
    overrides: dict, recipe: Path | None, run_name: str | None, results_dir: Path, resume: bool
) -> int:
    """The bench the options' settings ask for (over the recipe's), run; its exit code (a bad setting:
    its message, exit 1)."""
    try:
        config = with_overrides(load_recipe(recipe) if recipe else BenchConfig(), overrides)
        config.validate()
        tok = load_tokenizer(resolve_tokenizer(config.workload.tokenizer))
        name = run_name or run_folder_name(recipe)
        return run_bench(config, results_dir / name, resume, tok, console)
    except (BenchError, ModelError, ValueError) as exc:
        raise fail(str(exc)) from None


def run_bench(config: BenchConfig, run_dir: Path, resume: bool, tokenizer, console: Console) -> int:
    """Run the sweep with progress bars; return the exit code (0 only if every request succeeded)."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )

    def on_point_start(key: str, point: LoadPoint):
        task = progress.add_task(key, total=point.num_requests, errors=0)
        errors = 0

        def on_record(record: RequestRecord) -> None:
            nonlocal errors
            errors += not record.success
            progress.update(task, advance=1, errors=errors)

        return on_record

    points: list[PointSummary] = []
    interrupted = False
    with progress:
        try:
            notes = (lambda p: print_point_notes(console, p), lambda k, why: print_skipped(console, k, why))
            points = run_sweep(config, run_dir, resume, tokenizer, on_point_start, *notes)
        except KeyboardInterrupt:
            interrupted = True
    run = RunDir(run_dir)
    if interrupted:
        points = run.load_summaries()
    if points:
        table = results_table(points, f"p{max(config.load.percentiles):g}")
        wide = Console(width=None if console.is_terminal else natural_width(table))  # a file or pipe: all
        wide.print(table)
        for line in cost_source_lines(points):  # why a CPU or energy cell reads "-"
            wide.print(line, style="dim", markup=False)
        if (turns := turns_table(points)) is not None:
            wide.print(turns)
        # Imported here: the report pulls in matplotlib, which every other command would pay for.
        from llmopt.report.html import write_report

        write_report([run_dir], run.report)
    console.print(f"results: {run_dir}/{SUMMARY_JSON}, {SUMMARY_CSV}, {RECORDS}, {REPORT}")
    if interrupted:
        console.print("[yellow]interrupted: finished requests are kept; continue with --resume[/]")
        return 130
    failed = sum(p.failed for p in points)
    if failed:
        console.print(f"[red]{failed} request(s) failed[/]")
        return 1
    return 0


def print_point_notes(console: Console, summary: PointSummary) -> None:
    """What a finished point's table row cannot say: its failures, warnings, tools refused, why it
    saturated, early stop."""
    key = summary.key
    if summary.failed:
        errors = escape("; ".join(summary.errors[:3]))
        console.print(f"[yellow]{key}: {summary.failed} failed: {errors}[/]")
    for note in summary.warnings:
        console.print(f"[yellow]{key}: warning: {escape(note)}[/]")
    if (client := client_warning(summary)) is not None:
        console.print(client)
    if summary.tools not in (None, "sent"):
        console.print(f"[yellow]{key}: tools {escape(summary.tools)}[/]")
    if summary.saturated:
        console.print(f"[yellow]{key}: saturated: {escape(summary.saturation_reason)}[/]")
    if summary.stopped_early:
        console.print(f"[red]{key}: stopped early: {escape(summary.stopped_early)}[/]")


def print_skipped(console: Console, key: str, why: str) -> None:
    """A point --stop-on-saturation did not run, and why."""
    console.print(f"[yellow]{key}: skipped (--stop-on-saturation): {escape(why)}[/]")
