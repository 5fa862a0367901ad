"""`llmopt bench`: load-test any OpenAI-compatible endpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.shared_options import fail, float_list, int_list

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


def parse_and_run(
    params: dict, recipe: Path | None, run_name: str | None, results_dir: Path, resume: bool
) -> int:
    """The bench's settings from the parsed options, then the run (bench_run.py, imported only now: its
    client, aiohttp and the sweep are this command's imports alone)."""
    try:
        overrides = settings_from_options(params)
    except ValueError as exc:
        raise fail(str(exc)) from None
    from llmopt.cli.bench_run import start_bench

    return start_bench(overrides, recipe, run_name, results_dir, resume)


EndpointOption = Annotated[
    str | None, typer.Option(help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
]
ModelOption = Annotated[str | None, typer.Option(help="model name; default: the first of /v1/models")]
ApiKeyOption = Annotated[
    str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key (or $OPENAI_API_KEY)")
]
ApiOption = Annotated[
    str | None,
    typer.Option(
        help="chat, completions, responses (chained by previous_response_id) or messages; default: chat"
    ),
]
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
    raise typer.Exit(parse_and_run(ctx.params, recipe, run_name, results_dir, resume))
