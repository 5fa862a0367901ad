"""`llmopt quantize`: GPTQ / AWQ / INT8 with llm-compressor, and what it cost."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from llmopt.cli.shared_options import ModelArg, console, fail

if TYPE_CHECKING:  # rich.progress loads when the command runs, not on every `llmopt` start
    from rich.progress import Progress


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
    kld: Annotated[
        bool,
        typer.Option(help="KL divergence from the source in float32, before and after, on those windows"),
    ] = True,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Quantize a model with llm-compressor and report size, perplexity, KL divergence from the source and
    speed before and after."""

    from llmopt.checkpoints import ModelError
    from llmopt.cli.render import quant_table
    from llmopt.quant.out_folder import CheckpointWriteError
    from llmopt.quant.quant_report import REPORT_FILE
    from llmopt.quant.quantize import QuantizeConfig, QuantStackMissing
    from llmopt.quant.quantize import quantize as run_quantize

    logging.basicConfig(level=logging.WARNING)
    progress, step = progress_steps()
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
            kl_divergence=kld,
            overwrite=overwrite,
        )
        with progress:
            report = run_quantize(config, step)
    except (ModelError, ValueError, QuantStackMissing, CheckpointWriteError) as exc:
        raise fail(str(exc)) from None
    Console().print(quant_table(report))
    console.print(f"checkpoint: {out}  (report: {out / REPORT_FILE})")


def progress_steps() -> tuple[Progress, Callable[[str], AbstractContextManager]]:
    """A spinner per long step of the job: `with step(description):` shows it until the step ends."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    )

    @contextmanager
    def step(description: str) -> Iterator[None]:
        task = progress.add_task(description, total=1)
        yield
        progress.update(task, completed=1)

    return progress, step
