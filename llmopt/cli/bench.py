"""`llmopt bench`: load-test any OpenAI-compatible endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmopt.bench.client import RequestRecord
from llmopt.bench.runner import LoadPoint
from llmopt.bench.sweep import BenchConfig, RunDir, run_sweep
from llmopt.cli.options import console, fail, float_list, int_list
from llmopt.cli.render import results_table


def bench(
    endpoint: Annotated[
        str | None, typer.Option(help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
    ] = None,
    model: Annotated[str | None, typer.Option(help="model name; default: the first of /v1/models")] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key (or $OPENAI_API_KEY)")
    ] = None,
    api: Annotated[str, typer.Option(help="chat or completions")] = "chat",
    recipe: Annotated[
        Path | None, typer.Option(help="a sweep recipe (TOML); flags given here override it")
    ] = None,
    concurrency: Annotated[str | None, typer.Option(help="fixed concurrency points, e.g. 1,4,16")] = None,
    request_rate: Annotated[
        str | None, typer.Option(help="arrival-rate points in requests/s, e.g. 2,4")
    ] = None,
    arrival: Annotated[str, typer.Option(help="poisson or constant")] = "poisson",
    max_concurrency: Annotated[
        int | None, typer.Option(help="cap on in-flight requests for rate points")
    ] = None,
    num_requests: Annotated[int | None, typer.Option(help="requests per load point")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="stop sending after this long per point")] = None,
    warmup: Annotated[int | None, typer.Option(help="uncounted warm-up requests per point")] = None,
    workload: Annotated[str | None, typer.Option(help="random, shared-prefix, copy or file")] = None,
    prompt_len: Annotated[str | None, typer.Option(help="prompt lengths in tokens, e.g. 128,1024")] = None,
    output_len: Annotated[str | None, typer.Option(help="output lengths in tokens (max_tokens)")] = None,
    prefix_len: Annotated[
        int | None, typer.Option(help="shared-prefix length (shared-prefix workload)")
    ] = None,
    num_prefixes: Annotated[int | None, typer.Option(help="distinct shared prefixes")] = None,
    dataset: Annotated[Path | None, typer.Option(help="JSONL or ShareGPT JSON file (file workload)")] = None,
    slo: Annotated[str | None, typer.Option(help="goodput SLOs, e.g. ttft=500ms,tpot=50ms")] = None,
    percentiles: Annotated[str, typer.Option(help="percentiles to report")] = "50,90,99",
    max_error_rate: Annotated[float | None, typer.Option(help="stop a point once this share fails")] = None,
    ignore_eos: Annotated[bool, typer.Option(help="send ignore_eos so outputs have the asked length")] = True,
    tokenizer: Annotated[
        str | None, typer.Option(help="tokenizer for prompt lengths (model folder/.gguf)")
    ] = None,
    run_name: Annotated[
        str | None, typer.Option(help="folder under --results-dir; default: a timestamp")
    ] = None,
    results_dir: Path = Path("results"),
    resume: Annotated[bool, typer.Option(help="continue an interrupted run (same --run-name)")] = False,
    seed: int = 0,
) -> None:
    """Load-test any OpenAI-compatible endpoint (ours, vLLM, llama.cpp, a paid API)."""
    import datetime as dt

    from llmopt.bench.sweep import BenchConfig, BenchError, load_recipe
    from llmopt.checkpoints import ModelError, load_tokenizer, resolve_model

    try:
        config = load_recipe(recipe) if recipe else BenchConfig()
        overrides = {
            "endpoint": endpoint,
            "model": model,
            "api_key": api_key,
            "workload": workload,
            "num_requests": num_requests,
            "max_seconds": max_seconds,
            "warmup": warmup,
            "prefix_len": prefix_len,
            "num_prefixes": num_prefixes,
            "dataset": str(dataset) if dataset else None,
            "slo": slo,
            "max_error_rate": max_error_rate,
            "max_concurrency": max_concurrency,
            "tokenizer": tokenizer,
            "concurrencies": int_list(concurrency) or None,
            "request_rates": float_list(request_rate) or None,
            "prompt_lens": int_list(prompt_len) or None,
            "output_lens": int_list(output_len) or None,
        }
        for key, value in overrides.items():
            if value is not None:
                setattr(config, key, value)
        if endpoint:
            config.servers = []  # an endpoint on the command line replaces a recipe's local servers
        if api != "chat" or not recipe:
            config.api = api
        if arrival != "poisson" or not recipe:
            config.arrival = arrival
        config.ignore_eos, config.seed = ignore_eos, seed
        config.percentiles = tuple(float_list(percentiles))
        config.validate()
        tok = load_tokenizer(resolve_model(config.tokenizer))
        name = run_name or (recipe.stem + "-" if recipe else "") + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        code = run_bench(config, results_dir / name, resume, tok, console)
    except (BenchError, ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(code)


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
