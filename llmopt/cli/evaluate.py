"""`llmopt eval`: perplexity on held-out text, and with --reference the KL divergence from that model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.shared_options import DTYPE_HELP, ModelArg, fail


def evaluate(
    model: ModelArg = None,
    data: Annotated[
        Path | None, typer.Option(help="text (plain or JSONL); its second half is scored")
    ] = None,
    seq_len: Annotated[int, typer.Option(help="tokens per window")] = 512,
    windows: Annotated[int, typer.Option(help="how many windows to score")] = 8,
    backend: Annotated[str, typer.Option(help="engine (our forward) or transformers")] = "engine",
    dtype: Annotated[str, typer.Option(help="engine: " + DTYPE_HELP)] = "auto",
    lm_head_dtype: Annotated[str, typer.Option(help="engine: auto, float32 or int8")] = "auto",
    reference: Annotated[
        str | None,
        typer.Option(
            help="a model to compare with (e.g. the unquantized source), run in float32 through our engine: "
            "the KL divergence of MODEL's next-token distribution from it on the same windows"
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Perplexity on held-out text (sliding windows), for any model llmopt loads, full or quantized; with
    --reference, the KL divergence from that model too (as llama.cpp's `perplexity --kl-divergence`)."""
    import json

    from llmopt.checkpoints import ModelError
    from llmopt.evaluate.perplexity import perplexity

    logging.basicConfig(level=logging.WARNING)
    try:
        result = perplexity(model, data, seq_len, windows, backend, dtype, lm_head_dtype, reference)
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    if json_output:
        print(json.dumps(result.to_dict(), indent=2))
        return
    print(
        f"perplexity {result.perplexity:.4f} ({result.tokens} tokens in {result.windows} windows of "
        f"{result.seq_len}, {result.backend}, {result.seconds:.1f} s)"
    )
    if result.kl_divergence is not None:
        from rich.console import Console

        from llmopt.cli.render import kl_table

        Console().print(kl_table(result.kl_divergence, reference, result.reference_perplexity))
