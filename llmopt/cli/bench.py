"""`llmopt bench`: load-test any OpenAI-compatible endpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmopt.bench.bench_error import BenchError
from llmopt.bench.client import RequestRecord
from llmopt.bench.config import BenchConfig, with_overrides
from llmopt.bench.load_point import LoadPoint
from llmopt.bench.recipe import load_recipe
from llmopt.bench.rundir import RECORDS, REPORT, SUMMARY_CSV, SUMMARY_JSON, RunDir, run_folder_name
from llmopt.bench.sweep import run_sweep
from llmopt.checkpoints import ModelError, load_tokenizer, resolve_tokenizer
from llmopt.cli.options import console, fail, float_list, int_list
from llmopt.cli.render import client_warning, natural_width, results_table
from llmopt.report.machine_cost import cost_source_lines

# The options that are bench settings. Every one a recipe can set defaults to None, meaning "not given"
# (BenchConfig holds the real defaults), so a given value overrides the recipe even when it equals the
# default. These keep their name and value:
AS_GIVEN = (
    "endpoint model api_key api workload num_requests max_seconds warmup prefix_len num_prefixes slo "
    "max_error_rate arrival max_concurrency tokenizer ignore_eos seed request_timeout connection_reuse turns "
    "system_len think_time burstiness ramp_up prompt_len_spread reset_prefix_cache goodput_search "
    "search_percentile search_tolerance num_runs trace_block_size metrics_interval workers quantized_cache "
    "rounds stop_on_saturation"
).split()


def _list_of(parse: Callable[[str], list]) -> Callable[[str], list | None]:
    return lambda text: parse(text) or None  # "--prompt-len ''" is no list, as if not given


# ...and these are parsed, the list axes into plural fields: {option: (BenchConfig field, parse)}.
PARSED: dict[str, tuple[str, Callable[[object], object]]] = {
    "dataset": ("dataset", str),
    "trace": ("trace", str),
    "replay_speed": ("replay_speeds", _list_of(float_list)),
    "concurrency": ("concurrencies", _list_of(int_list)),
    "request_rate": ("request_rates", _list_of(float_list)),
    "prompt_len": ("prompt_lens", _list_of(int_list)),
    "output_len": ("output_lens", _list_of(int_list)),
    "sessions": ("sessions", _list_of(int_list)),
    "turn_len": ("prompt_lens", _list_of(int_list)),  # a multi-turn workload's prompt length
    "stream": ("streams", lambda given: [given]),
    "percentiles": ("percentiles", lambda text: tuple(float_list(text))),
}


def settings_from_options(options: dict[str, object]) -> dict[str, object]:
    """{BenchConfig field: value} for the bench settings among the parsed `options` (None: not given)."""
    if options["turn_len"] is not None and options["prompt_len"] is not None:
        raise ValueError("--turn-len is the multi-turn name of --prompt-len: give one of them")
    settings = {name: options[name] for name in AS_GIVEN}
    for name, (field, parse) in PARSED.items():
        if options[name] is not None or field not in settings:
            settings[field] = None if options[name] is None else parse(options[name])
    return settings


EndpointOption = Annotated[
    str | None, typer.Option(help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
]
ModelOption = Annotated[str | None, typer.Option(help="model name; default: the first of /v1/models")]
ApiKeyOption = Annotated[
    str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key (or $OPENAI_API_KEY)")
]
ApiOption = Annotated[str | None, typer.Option(help="chat or completions; default: chat")]
RecipeOption = Annotated[
    Path | None, typer.Option(help="a sweep recipe (TOML); flags given here override it")
]
ConcurrencyOption = Annotated[str | None, typer.Option(help="fixed concurrency points, e.g. 1,4,16")]
RateOption = Annotated[str | None, typer.Option(help="arrival-rate points in requests/s, e.g. 2,4")]
ArrivalOption = Annotated[str | None, typer.Option(help="poisson or constant; default: poisson")]
MaxConcurrencyOption = Annotated[int | None, typer.Option(help="cap on in-flight requests for rate points")]
NumRequestsOption = Annotated[int | None, typer.Option(help="requests per load point; default: 64")]
MaxSecondsOption = Annotated[float | None, typer.Option(help="stop sending after this long per point")]
WarmupOption = Annotated[int | None, typer.Option(help="uncounted warm-up requests per point; default: 2")]
WorkloadOption = Annotated[
    str | None,
    typer.Option(
        help="random, shared-prefix, copy, file, replay, multi-turn, agent or conversations; default: random"
    ),
]
PromptLenOption = Annotated[
    str | None, typer.Option(help="prompt lengths in tokens, e.g. 128,1024; default: 128")
]
OutputLenOption = Annotated[
    str | None, typer.Option(help="output lengths in tokens (max_tokens); default: 128")
]
PrefixLenOption = Annotated[int | None, typer.Option(help="shared-prefix length (shared-prefix workload)")]
NumPrefixesOption = Annotated[int | None, typer.Option(help="distinct shared prefixes; default: 1")]
DatasetOption = Annotated[
    Path | None, typer.Option(help="JSONL or ShareGPT JSON file (file and conversations workloads)")
]
SloOption = Annotated[str | None, typer.Option(help="goodput SLOs, e.g. ttft=500ms,tpot=50ms")]
PercentilesOption = Annotated[str, typer.Option(help="percentiles to report")]
MaxErrorRateOption = Annotated[float | None, typer.Option(help="stop a point once this share fails")]
ConnectionReuseOption = Annotated[
    bool | None,
    typer.Option(
        "--connection-reuse/--no-connection-reuse",
        help="keep-alive connections (default on); off for servers that drop them, such as llama.cpp's",
    ),
]
RequestTimeoutOption = Annotated[
    float | None,
    typer.Option(help="fail a request once the server sends nothing for this many seconds; default: 600"),
]
IgnoreEosOption = Annotated[bool, typer.Option(help="send ignore_eos so outputs have the asked length")]
TokenizerOption = Annotated[
    str | None, typer.Option(help="tokenizer for prompt lengths (model or tokenizer folder, .gguf)")
]
SessionsOption = Annotated[
    str | None,
    typer.Option(help="multi-turn workloads: sessions at once, one point each, e.g. 1,4; default: 1"),
]
TurnsOption = Annotated[int | None, typer.Option(help="turns per synthetic session; default: 4")]
TurnLenOption = Annotated[
    str | None, typer.Option(help="user or tool text per turn in tokens (the multi-turn --prompt-len)")
]
SystemLenOption = Annotated[
    int | None, typer.Option(help="shared system prompt of the synthetic sessions, tokens; default: 256")
]
ThinkTimeOption = Annotated[
    float | None, typer.Option(help="seconds between an answer and the session's next turn; default: 0")
]
BurstinessOption = Annotated[
    float | None, typer.Option(help="gamma shape of Poisson arrivals: 1 Poisson (default), < 1 burstier")
]
RampUpOption = Annotated[
    float | None, typer.Option(help="seconds over which a rate point's rate rises linearly from 0")
]
SpreadOption = Annotated[
    float | None, typer.Option(help="prompt lengths uniform in length * (1 +- this); default: 0")
]
StreamOption = Annotated[
    bool | None,
    typer.Option("--stream/--no-stream", help="stream answers (default); a recipe may sweep [true, false]"),
]
ResetCacheOption = Annotated[
    bool | None,
    typer.Option(
        "--reset-prefix-cache/--no-reset-prefix-cache",
        help="POST /reset_prefix_cache before each point where the server has it (default on)",
    ),
]
SearchOption = Annotated[
    str | None,
    typer.Option(
        help="find the highest load meeting these SLOs, e.g. ttft=500ms,tpot=50ms (doubling, bisection)"
    ),
]
SearchPercentileOption = Annotated[
    float | None, typer.Option(help="the percentile at which the searched SLOs must hold; default: 90")
]
SearchToleranceOption = Annotated[
    float | None, typer.Option(help="a rate search stops within this share of its answer; default: 0.1")
]
TraceOption = Annotated[
    Path | None, typer.Option(help="replay workload: a trace, JSONL in the Mooncake trace format")
]
ReplaySpeedOption = Annotated[
    str | None,
    typer.Option(help="replay the trace this many times as fast, one point each, e.g. 1,2; default: 1"),
]
TraceBlockSizeOption = Annotated[
    int | None, typer.Option(help="tokens per hash id of the trace; default: 512, Mooncake's")
]
WorkersOption = Annotated[
    int | None,
    typer.Option(help="client processes per point, for rates one event loop cannot drive; default: 1"),
]
NumRunsOption = Annotated[
    int | None, typer.Option(help="run each point this many times; summaries give 95 % intervals; default: 1")
]
RoundsOption = Annotated[
    int | None,
    typer.Option(help="recipe configs take turns: round 1 of each, then round 2 of each, ...; default: 1"),
]
MetricsIntervalOption = Annotated[
    float | None,
    typer.Option(help="seconds between samples of the server's /metrics during a point; 0: off; default 0.5"),
]
StopOnSaturationOption = Annotated[
    bool | None,
    typer.Option(
        "--stop-on-saturation/--no-stop-on-saturation",
        help="end a point once its queue grows (arrivals outrun completions) and skip its higher loads",
    ),
]
RunNameOption = Annotated[str | None, typer.Option(help="folder under --results-dir; default: a timestamp")]
ResumeOption = Annotated[bool, typer.Option(help="continue an interrupted run (same --run-name)")]
QuantizedCacheOption = Annotated[
    str | None,
    typer.Option(help="where `quantize` configs' checkpoints are cached; default ~/.cache/llmopt/quantized"),
]


def bench(
    ctx: typer.Context,
    endpoint: EndpointOption = None,
    model: ModelOption = None,
    api_key: ApiKeyOption = None,
    api: ApiOption = None,
    recipe: RecipeOption = None,
    concurrency: ConcurrencyOption = None,
    request_rate: RateOption = None,
    arrival: ArrivalOption = None,
    max_concurrency: MaxConcurrencyOption = None,
    num_requests: NumRequestsOption = None,
    max_seconds: MaxSecondsOption = None,
    warmup: WarmupOption = None,
    workload: WorkloadOption = None,
    prompt_len: PromptLenOption = None,
    output_len: OutputLenOption = None,
    prefix_len: PrefixLenOption = None,
    num_prefixes: NumPrefixesOption = None,
    dataset: DatasetOption = None,
    trace: TraceOption = None,
    replay_speed: ReplaySpeedOption = None,
    trace_block_size: TraceBlockSizeOption = None,
    slo: SloOption = None,
    percentiles: PercentilesOption = "50,90,99",
    max_error_rate: MaxErrorRateOption = None,
    request_timeout: RequestTimeoutOption = None,
    connection_reuse: ConnectionReuseOption = None,
    sessions: SessionsOption = None,
    turns: TurnsOption = None,
    turn_len: TurnLenOption = None,
    system_len: SystemLenOption = None,
    think_time: ThinkTimeOption = None,
    burstiness: BurstinessOption = None,
    ramp_up: RampUpOption = None,
    prompt_len_spread: SpreadOption = None,
    stream: StreamOption = None,
    reset_prefix_cache: ResetCacheOption = None,
    goodput_search: SearchOption = None,
    search_percentile: SearchPercentileOption = None,
    search_tolerance: SearchToleranceOption = None,
    num_runs: NumRunsOption = None,
    rounds: RoundsOption = None,
    workers: WorkersOption = None,
    metrics_interval: MetricsIntervalOption = None,
    stop_on_saturation: StopOnSaturationOption = None,
    ignore_eos: IgnoreEosOption = True,
    tokenizer: TokenizerOption = None,
    run_name: RunNameOption = None,
    results_dir: Path = Path("results"),
    resume: ResumeOption = False,
    quantized_cache: QuantizedCacheOption = None,
    seed: int = 0,
) -> None:
    """Load-test any OpenAI-compatible endpoint (ours, vLLM, llama.cpp, a paid API)."""
    # The settings are read by option name from ctx.params (see SETTINGS), not one parameter at a time.
    raise typer.Exit(start_bench(ctx.params, recipe, run_name, results_dir, resume))


def start_bench(
    params: dict, recipe: Path | None, run_name: str | None, results_dir: Path, resume: bool
) -> int:
    """The bench the parsed options ask for, run; its exit code (a bad setting: its message, exit 1)."""
    try:
        overrides = settings_from_options(params)
        config = with_overrides(load_recipe(recipe) if recipe else BenchConfig(), overrides)
        config.validate()
        tok = load_tokenizer(resolve_tokenizer(config.tokenizer))
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

    points: list[dict] = []
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
        table = results_table(points, f"p{max(config.percentiles):g}")
        wide = Console(width=None if console.is_terminal else natural_width(table))  # a file or pipe: all
        wide.print(table)
        for line in cost_source_lines(points):  # why a CPU or energy cell reads "-"
            wide.print(line, style="dim", markup=False)
        # Imported here: the report pulls in matplotlib, which every other command would pay for.
        from llmopt.report.html import write_report

        write_report([run_dir], run.report)
    console.print(f"results: {run_dir}/{SUMMARY_JSON}, {SUMMARY_CSV}, {RECORDS}, {REPORT}")
    if interrupted:
        console.print("[yellow]interrupted: finished requests are kept; continue with --resume[/]")
        return 130
    failed = sum(p["failed"] for p in points)
    if failed:
        console.print(f"[red]{failed} request(s) failed[/]")
        return 1
    return 0


def print_point_notes(console: Console, summary: dict) -> None:
    """What a finished point's table row cannot say: its failures, warnings, tools refused, why it
    saturated, early stop."""
    key = summary["key"]
    if summary["failed"]:
        errors = escape("; ".join(summary["errors"][:3]))
        console.print(f"[yellow]{key}: {summary['failed']} failed: {errors}[/]")
    for note in summary.get("warnings") or []:
        console.print(f"[yellow]{key}: warning: {escape(note)}[/]")
    if (client := client_warning(summary)) is not None:
        console.print(client)
    if summary.get("tools") not in (None, "sent"):
        console.print(f"[yellow]{key}: tools {escape(summary['tools'])}[/]")
    if summary.get("saturated"):
        console.print(f"[yellow]{key}: saturated: {escape(summary['saturation_reason'])}[/]")
    if summary.get("stopped_early"):
        console.print(f"[red]{key}: stopped early: {escape(summary['stopped_early'])}[/]")


def print_skipped(console: Console, key: str, why: str) -> None:
    """A point --stop-on-saturation did not run, and why."""
    console.print(f"[yellow]{key}: skipped (--stop-on-saturation): {escape(why)}[/]")
