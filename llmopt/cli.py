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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
