"""`llmopt serve`: the OpenAI-compatible server on llmopt's engine (or a peer's). The flags default to
the serve options' defaults (engine_servers/options.py, the one place they are written)."""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Annotated

import typer

from llmopt.cli.shared_options import DTYPE_HELP, SPEC_HELP, ModelArg, fail
from llmopt.engine.config import KV_CACHE_DTYPES
from llmopt.engine_servers.options import API, API_KEY_ENV, ENGINE, LISTENER, ServeOptions

SHARING_HELP = "a request waits for prefix blocks another is computing instead of computing them too"
LM_HEAD_HELP = "auto, float32 or int8: the output layer quantized at load, a scale per 32 inputs"
PARALLEL_HELP = "--engine vllm only, passed through"
NO_LOG_HELP = "no access-log line per request"
NO_ADMIN_HELP = "leave out /reset_prefix_cache"
KV_MEMORY_HELP = "KV pool memory; default: a quarter of what is free after the weights"
KV_DISK_HELP = (
    "GB of prefix-cache blocks kept on disk (under $LLMOPT_CACHE/kv): evicted ones are written, and read "
    "back instead of recomputed; default: 10 % of the free disk, at most 20; 0: off"
)
D = ServeOptions  # each flag's default is the option's: D.port is 8000


def serve(
    model: ModelArg = D.model,
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 exposes the server")] = D.host,
    port: int = D.port,
    served_model_name: Annotated[
        str | None, typer.Option(help="model name in the API")
    ] = D.served_model_name,
    api_key: Annotated[
        str | None,
        typer.Option(envvar=API_KEY_ENV, help=f"require 'Authorization: Bearer KEY' (or ${API_KEY_ENV})"),
    ] = D.api_key,
    max_num_seqs: int = D.max_num_seqs,
    max_num_batched_tokens: int = D.max_num_batched_tokens,
    block_size: int = D.block_size,
    num_kv_blocks: Annotated[
        int | None, typer.Option(help="KV pool size; default from --kv-cache-memory-gb")
    ] = D.num_kv_blocks,
    kv_cache_memory_gb: Annotated[float | None, typer.Option(help=KV_MEMORY_HELP)] = D.kv_cache_memory_gb,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="auto (the model's dtype) or int8: ~3.8x the KV blocks in the same memory")
    ] = D.kv_cache_dtype,
    enable_prefix_caching: bool = D.enable_prefix_caching,
    kv_disk_gb: Annotated[float | None, typer.Option(help=KV_DISK_HELP)] = D.kv_disk_gb,
    inflight_prefix_sharing: Annotated[bool, typer.Option(help=SHARING_HELP)] = D.inflight_prefix_sharing,
    max_model_len: int | None = D.max_model_len,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = D.dtype,
    lm_head_dtype: Annotated[str, typer.Option(help=LM_HEAD_HELP)] = D.lm_head_dtype,
    max_queue_len: Annotated[
        int, typer.Option(help="waiting requests beyond this get HTTP 429")
    ] = D.max_queue_len,
    max_request_bytes: Annotated[
        int, typer.Option(help="request bodies beyond this get HTTP 413")
    ] = D.max_request_bytes,
    limit_concurrency: Annotated[
        int, typer.Option(help="open connections beyond this get HTTP 503 (uvicorn)")
    ] = D.limit_concurrency,
    timeout_keep_alive: Annotated[
        float, typer.Option(help="close idle keep-alive connections (s)")
    ] = D.timeout_keep_alive,
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = D.speculative_config,
    tensor_parallel_size: Annotated[int, typer.Option(help=PARALLEL_HELP)] = D.tensor_parallel_size,
    pipeline_parallel_size: Annotated[int, typer.Option(help=PARALLEL_HELP)] = D.pipeline_parallel_size,
    data_parallel_size: Annotated[int, typer.Option(help=PARALLEL_HELP)] = D.data_parallel_size,
    disable_log_requests: Annotated[bool, typer.Option(help=NO_LOG_HELP)] = D.disable_log_requests,
    disable_admin_routes: Annotated[bool, typer.Option(help=NO_ADMIN_HELP)] = D.disable_admin_routes,
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
    given = locals()  # every parameter named after a serve option is that option
    options = ServeOptions(**{f.name: given[f.name] for f in dataclasses.fields(ServeOptions)})
    serve_on(engine, options, engine_python, dry_run)


def serve_on(engine: str, options: ServeOptions, engine_python: str | None, dry_run: bool) -> None:
    """Run `options` on `engine`: a peer through llmopt.engine_servers, llmopt's own engine here."""
    from llmopt.engine_servers.engine_error import EngineError
    from llmopt.engine_servers.llmopt import unsupported
    from llmopt.engine_servers.serve_engine import serve_engine

    if options.kv_cache_dtype not in KV_CACHE_DTYPES:
        given = options.kv_cache_dtype
        raise fail(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {given!r}", code=2)
    if engine != "llmopt":
        try:
            code = serve_engine(engine, options, engine_python, dry_run)
        except EngineError as exc:
            raise fail(str(exc)) from None
        raise typer.Exit(code)
    if why := unsupported(options, engine_python):
        raise fail(why, code=2)
    serve_llmopt(options, dry_run)


def serve_llmopt(options: ServeOptions, dry_run: bool) -> None:
    """The options as llmopt's engine config, API settings and listener (each validates its own), then
    the server in this process until it is stopped."""
    from llmopt.checkpoints import ModelError, served_name
    from llmopt.engine.config import EngineConfig
    from llmopt.server.serve import Listener
    from llmopt.server.serve import serve as run_server
    from llmopt.server.settings import ServerSettings

    try:
        config = EngineConfig(**options.part(ENGINE))
        if dry_run:
            print(config)
            return
        name = options.served_model_name or served_name(options.model)
        settings = ServerSettings(name, **options.part(API), api_key_env=API_KEY_ENV)
        log_to_stderr()
        run_server(config, settings, Listener(**options.part(LISTENER)))
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None


def log_to_stderr() -> None:
    """The serve process's log: INFO and up, timestamped, on stderr (the root logger is process-wide;
    this command owns its process, so it sets it up here rather than the server library)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
