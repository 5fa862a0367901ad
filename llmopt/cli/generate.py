"""`llmopt generate`: one completion in-process, with its speed."""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer

from llmopt.cli.shared_options import DTYPE_HELP, SPEC_HELP, console, fail
from llmopt.engine.config import EngineConfig


def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt text")],
    model: Annotated[str | None, typer.Option(help="model folder, .gguf file or alias")] = None,
    max_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the model's chat template")] = False,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    lm_head_dtype: Annotated[str, typer.Option(help="auto, float32 or int8 (a scale per 32)")] = "auto",
    speculative_config: Annotated[str | None, typer.Option(help=SPEC_HELP)] = EngineConfig.speculative_config,
) -> None:
    """Generate a completion in-process and print it with its speed."""
    from llmopt.checkpoints import ModelError
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams

    logging.basicConfig(level=logging.WARNING)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        llm = LLM(model, dtype=dtype, lm_head_dtype=lm_head_dtype, speculative_config=speculative_config)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    console.print(llm.engine.runner.startup_line, style="dim", markup=False)  # its [reason] is text
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
