"""`llmopt serve`: the OpenAI-compatible server on llmopt's engine."""

from __future__ import annotations

from typing import Annotated

import typer

from llmopt.cli.options import SPEC_HELP, ModelArg, fail


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
    enable_prefix_caching: bool = True,
    max_model_len: int | None = None,
    dtype: str = "float32",
    max_queue_len: Annotated[int, typer.Option(help="waiting requests beyond this get HTTP 429")] = 256,
    max_request_bytes: Annotated[int, typer.Option(help="request bodies beyond this get HTTP 413")] = 4
    * 2**20,
    limit_concurrency: Annotated[
        int, typer.Option(help="open connections beyond this get HTTP 503 (uvicorn)")
    ] = 1024,
    timeout_keep_alive: Annotated[float, typer.Option(help="close idle keep-alive connections (s)")] = 5.0,
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Serve a model behind an OpenAI-compatible API (flags follow vLLM's)."""
    from llmopt.checkpoints import DEFAULT_MODEL, ModelError
    from llmopt.engine.config import EngineConfig
    from llmopt.server.serve import Listener
    from llmopt.server.serve import serve as run_server
    from llmopt.server.settings import ServerSettings

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
        settings = ServerSettings(
            served_model_name or model or DEFAULT_MODEL, api_key, max_queue_len, max_request_bytes
        )
        run_server(config, settings, Listener(host, port, limit_concurrency, timeout_keep_alive))
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
