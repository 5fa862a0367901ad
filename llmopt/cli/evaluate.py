"""`llmopt eval`: perplexity on held-out text."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.options import DTYPE_HELP, ModelArg, fail


def evaluate(
    model: ModelArg = None,
    data: Annotated[
        Path | None, typer.Option(help="text (plain or JSONL); its second half is scored")
    ] = None,
    seq_len: Annotated[int, typer.Option(help="tokens per window")] = 512,
    windows: Annotated[int, typer.Option(help="how many windows to score")] = 8,
    backend: Annotated[str, typer.Option(help="engine (our forward) or transformers")] = "engine",
    dtype: Annotated[str, typer.Option(help="engine: " + DTYPE_HELP)] = "auto",
    lm_head_dtype: Annotated[str, typer.Option(help="engine: auto, float32 or int8 (per row)")] = "auto",
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Perplexity on held-out text (sliding windows), for any model llmopt loads, full or quantized."""
    import json

    from llmopt.checkpoints import ModelError
    from llmopt.evaluate.perplexity import perplexity

    logging.basicConfig(level=logging.WARNING)
    try:
        result = perplexity(model, data, seq_len, windows, backend, dtype, lm_head_dtype)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    if json_output:
        print(json.dumps(result.to_dict(), indent=2))
        return
    print(
        f"perplexity {result.perplexity:.4f} ({result.tokens} tokens in {result.windows} windows of "
        f"{result.seq_len}, {result.backend}, {result.seconds:.1f} s)"
    )
