"""The `llmopt` command line: each command parses its options and calls one job function."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Quantize, serve and benchmark LLMs.")
console = Console(stderr=True, soft_wrap=True)

ModelArg = Annotated[
    str | None, typer.Argument(help="HF model folder, .gguf file, or 'smollm2-135m' (the default)")
]


@app.callback()
def root() -> None:
    """Quantize, serve and benchmark LLMs."""


SPEC_HELP = (
    "speculative decoding, as vLLM: "
    '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' '
    'or \'{"method": "draft", "model": PATH, "num_speculative_tokens": 4}\''
)


def fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=1)


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt text")],
    model: Annotated[str | None, typer.Option(help="model folder, .gguf file or alias")] = None,
    max_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the model's chat template")] = False,
    dtype: str = "float32",
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Generate a completion in-process and print it with its speed."""
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams
    from llmopt.models import ModelError

    logging.basicConfig(level=logging.WARNING)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        llm = LLM(model, dtype=dtype, speculative_config=speculative_config)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    request = llm.chat_prompt(prompt) if chat else prompt
    start = time.perf_counter()
    try:
        [result] = llm.generate(request, params)
    except ValueError as exc:
        raise fail(str(exc)) from None
    elapsed = time.perf_counter() - start
    print(result.text)
    console.print(
        f"[dim]{len(result.token_ids)} tokens in {elapsed:.2f} s "
        f"({len(result.token_ids) / elapsed:.1f} tok/s), finish_reason={result.finish_reason}[/dim]"
    )


@app.command()
def serve(
    model: ModelArg = None,
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 exposes the server")] = "127.0.0.1",
    port: int = 8000,
    served_model_name: Annotated[str | None, typer.Option(help="model name in the API")] = None,
    api_key: Annotated[str | None, typer.Option(help="require 'Authorization: Bearer KEY'")] = None,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 512,
    block_size: int = 16,
    num_kv_blocks: Annotated[
        int | None, typer.Option(help="KV pool size; default from --kv-cache-memory-gb")
    ] = None,
    kv_cache_memory_gb: float = 1.0,
    enable_prefix_caching: bool = True,
    max_model_len: int | None = None,
    dtype: str = "float32",
    max_queue_len: Annotated[
        int | None, typer.Option(help="waiting requests beyond this get HTTP 429")
    ] = None,
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Serve a model behind an OpenAI-compatible API (flags follow vLLM's)."""
    from llmopt.engine.config import EngineConfig
    from llmopt.models import ModelError
    from llmopt.server.serve import serve as run_server

    try:
        config = EngineConfig(
            model=model,
            dtype=dtype,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            kv_cache_memory_gb=kv_cache_memory_gb,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            speculative_config=speculative_config,
        )
        run_server(config, host, port, served_model_name, api_key, max_queue_len)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None


def int_list(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def float_list(text: str | None) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()] if text else []


@app.command()
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

    from llmopt.bench.console import run_bench
    from llmopt.bench.sweep import BenchConfig, BenchError, load_recipe
    from llmopt.models import ModelError, load_tokenizer, resolve_model

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


@app.command()
def report(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="bench run folders (results/<run>); several are overlaid")
    ],
    out: Annotated[Path, typer.Option(help="the HTML file to write")] = Path("report.html"),
    pricing: Annotated[
        Path | None, typer.Option(help="pricing models (default recipes/pricing.toml)")
    ] = None,
) -> None:
    """Write one self-contained HTML report (plots inlined) for one or more bench runs."""
    from llmopt.report.html import write_report

    try:
        path = write_report(run_dirs, out, pricing)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    console.print(f"report: {path}")


@app.command()
def cost(
    prompt_tokens: Annotated[float, typer.Option(help="prompt tokens per request")],
    output_tokens: Annotated[float, typer.Option(help="output tokens per request")],
    requests: Annotated[int, typer.Option(help="how many requests to price")] = 1000,
    request_throughput: Annotated[
        float | None, typer.Option(help="requests/s a self-hosted server sustains (prices gpu-hour models)")
    ] = None,
    pricing: Annotated[
        Path | None, typer.Option(help="pricing models (default recipes/pricing.toml)")
    ] = None,
) -> None:
    """Compare token-based, request-based and self-hosted pricing for a request shape, without a run."""
    from rich.table import Table

    from llmopt.bench.cost import cost_table, load_pricing
    from llmopt.report.html import break_even, money

    if prompt_tokens < 0 or output_tokens < 0 or requests < 1:
        raise fail("token counts must be >= 0 and --requests >= 1")
    try:
        rows = cost_table(load_pricing(pricing), prompt_tokens, output_tokens, requests, request_throughput)
    except ValueError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"{prompt_tokens:,.0f} prompt + {output_tokens:,.0f} output tokens per request")
    for col in (
        "pricing model",
        "kind",
        "$ / request",
        "$ / 1M output tokens",
        f"$ for {requests:,} requests",
        "break-even prompt length",
    ):
        table.add_column(
            col, justify="left" if col in ("pricing model", "kind", "break-even prompt length") else "right"
        )
    for r in rows:
        total = money(r["total"]) if r["total"] is not None else "- (give --request-throughput)"
        table.add_row(
            r["name"],
            r["kind"],
            money(r["per_request"]),
            money(r["per_1m_output_tokens"]),
            total,
            break_even(r),
        )
    Console(width=200).print(table)


@app.command()
def quantize(
    model: ModelArg = None,
    out: Annotated[
        Path, typer.Option(help="folder for the quantized checkpoint (compressed-tensors)")
    ] = Path("quantized"),
    method: Annotated[str, typer.Option(help="gptq, awq or int8")] = "gptq",
    bits: Annotated[int | None, typer.Option(help="4 (gptq, awq) or 8 (int8, gptq)")] = None,
    group_size: Annotated[
        int | None,
        typer.Option(help="input columns per scale; default: per channel at 8 bits, else 128/64/32"),
    ] = None,
    calib: Annotated[Path | None, typer.Option(help="calibration text: plain text or JSONL")] = None,
    calib_samples: Annotated[
        int | None, typer.Option(help="calibration samples; default 64 (gptq), 8 (awq, int8)")
    ] = None,
    seq_len: Annotated[int, typer.Option(help="tokens per calibration sample")] = 256,
    eval_windows: Annotated[int, typer.Option(help="held-out windows of 512 tokens for perplexity")] = 8,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Quantize a model with llm-compressor and report size, perplexity and speed before and after."""
    from contextlib import contextmanager

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from llmopt.models import ModelError
    from llmopt.quant.quantize import REPORT_FILE, QuantizeConfig
    from llmopt.quant.quantize import quantize as run_quantize

    logging.basicConfig(level=logging.WARNING)
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    )

    @contextmanager
    def step(description: str):
        task = progress.add_task(description, total=1)
        yield
        progress.update(task, completed=1)

    try:
        config = QuantizeConfig(
            model=model,
            out=out,
            method=method,
            bits=bits,
            group_size=group_size,
            calib=calib,
            calib_samples=calib_samples,
            seq_len=seq_len,
            eval_windows=eval_windows,
            overwrite=overwrite,
        )
        with progress:
            report = run_quantize(config, step)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    group = "per channel" if report.group_size is None else f"group {report.group_size}"
    table = Table(
        title=f"{report.method.upper()} {report.bits}-bit, {group}",
        caption=f"{report.calibration_samples} calibration samples, {report.seconds:.0f} s",
    )
    for column in ("", "before", "after"):
        table.add_column(column, justify="left" if not column else "right")
    for row in report.rows():
        table.add_row(*row)
    Console().print(table)
    console.print(f"checkpoint: {out}  (report: {out / REPORT_FILE})")


@app.command("eval")
def evaluate(
    model: ModelArg = None,
    data: Annotated[
        Path | None, typer.Option(help="text (plain or JSONL); its second half is scored")
    ] = None,
    seq_len: Annotated[int, typer.Option(help="tokens per window")] = 512,
    windows: Annotated[int, typer.Option(help="how many windows to score")] = 8,
    backend: Annotated[str, typer.Option(help="engine (our forward) or transformers")] = "engine",
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Perplexity on held-out text (sliding windows), for any model llmopt loads, full or quantized."""
    import json

    from llmopt.models import ModelError
    from llmopt.quant.eval import perplexity

    logging.basicConfig(level=logging.WARNING)
    try:
        result = perplexity(model, data, seq_len, windows, backend)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    if json_output:
        print(json.dumps(result.to_dict(), indent=2))
        return
    print(
        f"perplexity {result.perplexity:.4f} ({result.tokens} tokens in {result.windows} windows of "
        f"{result.seq_len}, {result.backend}, {result.seconds:.1f} s)"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
