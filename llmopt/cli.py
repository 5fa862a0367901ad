"""The `llmopt` command line: each command parses its options and calls one job function."""

from __future__ import annotations

import logging
import time
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
        llm = LLM(model, dtype=dtype)
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
        )
        run_server(config, host, port, served_model_name, api_key, max_queue_len)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
