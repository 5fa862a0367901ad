"""What every command shares: the stderr console, the model argument, the one-line error exit."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)

ModelArg = Annotated[
    str | None, typer.Argument(help="HF model folder, .gguf file, or 'smollm2-135m' (the default)")
]

SPEC_HELP = (
    "speculative decoding: auto (default: prompt lookup, taking only the proposals that pay at the measured "
    "step cost, for greedy requests), off, or vLLM's JSON: "
    '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' '
    'or \'{"method": "draft", "model": PATH}\' (num_speculative_tokens 4 unless given)'
)

DTYPE_HELP = (
    "auto (default): each checkpoint in its own format on this CPU's fastest exact kernel (a .gguf's "
    "quantized blocks, compressed-tensors int4/int8, bf16 where the CPU has bf16 matmuls, else fp32; the "
    "start-up line says what runs); float32: the exact reference; bfloat16, float16"
)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one error line; the caller raises the returned Exit (exit code 1, or `code`: 2 for a usage
    error where 1 means something else, as for `llmopt report --fail-if`). The message is escaped:
    messages quote "[load]", "[[serve]]" or "llmopt[quant]", which the console would read as markup."""
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code=code)


def int_list(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def float_list(text: str | None) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()] if text else []
