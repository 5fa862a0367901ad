"""`llmopt bench` on the console: a progress bar per load point, a table of the results, an exit code."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmopt.bench.client import RequestRecord
from llmopt.bench.runner import LoadPoint
from llmopt.bench.sweep import BenchConfig, run_sweep


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(points: list[dict], percentile: str = "p99") -> Table:
    table = Table(title="llmopt bench")
    columns = [
        "server",
        "prompt",
        "output",
        "load",
        "ok",
        "failed",
        "req/s",
        "out tok/s",
        "total tok/s",
        "TTFT med",
        f"TTFT {percentile}",
        "TPOT med",
        "ITL med",
        f"ITL {percentile}",
        "E2E med",
        "goodput",
    ]
    for col in columns:
        table.add_column(col, justify="right" if col not in ("server", "load") else "left")
    for p in points:
        table.add_row(
            p["server"],
            str(p["prompt_len"]),
            str(p["output_len"]),
            p["load"],
            str(p["successful"]),
            str(p["failed"]),
            fmt(p["request_throughput"], 2),
            fmt(p["output_throughput"]),
            fmt(p["total_token_throughput"]),
            fmt(p["ttft_ms"]["median"], 0),
            fmt(p["ttft_ms"].get(percentile), 0),
            fmt(p["tpot_ms"]["median"]),
            fmt(p["itl_ms"]["median"]),
            fmt(p["itl_ms"].get(percentile)),
            fmt(p["e2e_ms"]["median"], 0),
            fmt(p.get("goodput"), 2) if "goodput" in p else "-",
        )
    return table


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

    def on_point_done(summary: dict) -> None:
        if summary["failed"]:
            console.print(
                f"[yellow]{summary['key']}: {summary['failed']} failed: {'; '.join(summary['errors'][:3])}[/]"
            )
        if summary.get("stopped_early"):
            console.print(f"[red]{summary['key']}: stopped early: {summary['stopped_early']}[/]")

    points: list[dict] = []
    interrupted = False
    with progress:
        try:
            points = run_sweep(config, run_dir, resume, tokenizer, on_point_start, on_point_done)
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        from llmopt.bench.sweep import RunDir

        points = RunDir(run_dir).load_summaries()
    if points:
        wide = Console(width=None if console.is_terminal else 200)  # a file or pipe gets the whole table
        wide.print(results_table(points, f"p{max(config.percentiles):g}"))
    if points:
        from llmopt.report.html import write_report

        write_report([run_dir], run_dir / "report.html")
    console.print(f"results: {run_dir}/summary.json, summary.csv, requests.jsonl, report.html")
    if interrupted:
        console.print("[yellow]interrupted: finished requests are kept; continue with --resume[/]")
        return 130
    failed = sum(p["failed"] for p in points)
    if failed:
        console.print(f"[red]{failed} request(s) failed[/]")
        return 1
    return 0
