"""`llmopt serve`: the OpenAI-compatible server on llmopt's engine."""

from __future__ import annotations

from typing import Annotated

import typer

from llmopt.cli.options import DTYPE_HELP, SPEC_HELP, ModelArg, fail
from llmopt.engine.config import KV_CACHE_DTYPES

SHARING_HELP = "a request waits for prefix blocks another is computing instead of computing them too"
LM_HEAD_HELP = "auto, float32 or int8: the output layer quantized per row at load"


def serve(
    model: ModelArg = None,
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 exposes the server")] = "127.0.0.1",
    port: int = 8000,
    served_model_name: Annotated[str | None, typer.Option(help="model name in the API")] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="LLMOPT_API_KEY", help="require 'Authorization: Bearer KEY' (or $LLMOPT_API_KEY)"
        ),
    ] = None,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 512,
    block_size: int = 16,
    num_kv_blocks: Annotated[
        int | None, typer.Option(help="KV pool size; default from --kv-cache-memory-gb")
    ] = None,
    kv_cache_memory_gb: float = 1.0,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="auto (the model's dtype) or int8: ~3.8x the KV blocks in the same memory")
    ] = "auto",
    enable_prefix_caching: bool = True,
    inflight_prefix_sharing: Annotated[bool, typer.Option(help=SHARING_HELP)] = True,
    max_model_len: int | None = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    lm_head_dtype: Annotated[str, typer.Option(help=LM_HEAD_HELP)] = "auto",
    max_queue_len: Annotated[int, typer.Option(help="waiting requests beyond this get HTTP 429")] = 256,
    max_request_bytes: Annotated[int, typer.Option(help="request bodies beyond this get HTTP 413")] = 4
    * 2**20,
    limit_concurrency: Annotated[
        int, typer.Option(help="open connections beyond this get HTTP 503 (uvicorn)")
    ] = 1024,
    timeout_keep_alive: Annotated[float, typer.Option(help="close idle keep-alive connections (s)")] = 5.0,
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = None,
    tensor_parallel_size: Annotated[int, typer.Option(help="--engine vllm only, passed through")] = 1,
    pipeline_parallel_size: Annotated[int, typer.Option(help="--engine vllm only, passed through")] = 1,
    data_parallel_size: Annotated[int, typer.Option(help="--engine vllm only, passed through")] = 1,
    engine: Annotated[
        str,
        typer.Option(help="llmopt, vllm or llama.cpp: the same flags, translated (docs/engines.md)"),
    ] = "llmopt",
    engine_python: Annotated[
        str | None, typer.Option(help="the Python that has vllm / xllamacpp (else $LLMOPT_VLLM_PYTHON, ...)")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="print the command (or engine config) and exit")] = False,
) -> None:
    """Serve a model behind an OpenAI-compatible API (flags follow vLLM's), on llmopt's engine or a peer's."""
    from llmopt.engines.options import ServeOptions

    options = ServeOptions(
        model, host, port, served_model_name, api_key, max_num_seqs, max_num_batched_tokens, block_size,
        num_kv_blocks, kv_cache_memory_gb, enable_prefix_caching, max_model_len, dtype, max_queue_len,
        max_request_bytes, limit_concurrency, timeout_keep_alive, speculative_config,
        tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
        inflight_prefix_sharing=inflight_prefix_sharing, kv_cache_dtype=kv_cache_dtype,
        lm_head_dtype=lm_head_dtype,
    )  # fmt: skip
    serve_on(engine, options, engine_python, dry_run)


def serve_on(engine: str, options, engine_python: str | None, dry_run: bool) -> None:
    """Run `options` on `engine`: a peer through llmopt.engines, llmopt's own engine here."""
    from llmopt.engines.errors import EngineError
    from llmopt.engines.serve import serve_engine

    if options.kv_cache_dtype not in KV_CACHE_DTYPES:
        given = options.kv_cache_dtype
        raise fail(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {given!r}", code=2)
    if engine != "llmopt":
        try:
            code = serve_engine(engine, options, engine_python, dry_run)
        except EngineError as exc:
            raise fail(str(exc)) from None
        raise typer.Exit(code)
    parallel = [n for n in ("tensor", "pipeline", "data") if getattr(options, f"{n}_parallel_size") != 1]
    if parallel or engine_python:
        given = [f"--{n}-parallel-size" for n in parallel] + ["--engine-python"] * bool(engine_python)
        raise fail(f"{', '.join(given)}: llmopt's engine runs on one machine; use --engine vllm", code=2)
    serve_llmopt(options, dry_run)


def serve_llmopt(options, dry_run: bool) -> None:
    from llmopt.checkpoints import DEFAULT_MODEL, ModelError
    from llmopt.engine.config import EngineConfig
    from llmopt.server.serve import Listener
    from llmopt.server.serve import serve as run_server
    from llmopt.server.settings import ServerSettings

    o = options
    try:
        config = EngineConfig(
            model=o.model,
            dtype=o.dtype,
            lm_head_dtype=o.lm_head_dtype,
            block_size=o.block_size,
            num_kv_blocks=o.num_kv_blocks,
            kv_cache_memory_gb=o.kv_cache_memory_gb,
            kv_cache_dtype=o.kv_cache_dtype,
            max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens,
            max_model_len=o.max_model_len,
            enable_prefix_caching=o.enable_prefix_caching,
            inflight_prefix_sharing=o.inflight_prefix_sharing,
            speculative_config=o.speculative_config,
        )
        if dry_run:
            print(config)
            return
        settings = ServerSettings(
            o.served_model_name or o.model or DEFAULT_MODEL, o.api_key, o.max_queue_len, o.max_request_bytes
        )
        run_server(config, settings, Listener(o.host, o.port, o.limit_concurrency, o.timeout_keep_alive))
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
