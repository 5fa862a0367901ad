"""What `--dtype` means for each part of the model, decided once at load from the checkpoint and this
CPU's flags: the activations' dtype, whether a GGUF's quantized tensors stay as the file stores them,
and why; after the load, one start-up line says what runs for the weights, the output layer and the KV
cache. `float32` is the exact reference; `auto` (the default, as in vLLM) is each checkpoint in its own
format on the fastest exact kernel this CPU has."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from llmopt.checkpoints import is_gguf
from llmopt.engine import kernels
from llmopt.engine.config import DTYPE_CHOICES
from llmopt.engine.formats import checkpoint_quantization
from llmopt.engine.layers.quantized_linear import QuantizedLinear

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The instructions that make bf16 matmuls faster than fp32 ones on a CPU; without them PyTorch converts
# bf16 to fp32 around every op, and the compiled kernels (fp32) do not run at all.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Precision:
    """The resolved `--dtype`: `compute` for activations (and the KV cache unless it is int8),
    `native_gguf` whether a GGUF's quantized tensors stay quantized (else they are dequantized in memory,
    tensor by tensor, to `compute`), `reason` why."""

    asked: str
    compute: torch.dtype
    native_gguf: bool
    reason: str


def checkpoint_dtype(model_dir: Path) -> str | None:
    """The dtype a Hugging Face folder's config.json names (`torch_dtype`, or transformers 5's `dtype`)."""
    config = json.loads((model_dir / "config.json").read_text())
    value = config.get("torch_dtype") or config.get("dtype")
    return str(value).removeprefix("torch.") if value else None


def resolve_precision(dtype: str, checkpoint: Path, cpu_flags: set[str] | None = None) -> Precision:
    """`dtype` for the checkpoint (a folder or a .gguf file)."""
    assert dtype in DTYPE_CHOICES, dtype
    checkpoint = Path(checkpoint)
    if dtype != "auto":
        return Precision(dtype, DTYPES[dtype], False, "asked for")
    if is_gguf(checkpoint):
        return Precision(dtype, torch.float32, True, "the GGUF file's own quantized blocks")
    if checkpoint_quantization(checkpoint):
        return Precision(dtype, torch.float32, False, "the checkpoint's own quantized weights")
    stored = checkpoint_dtype(checkpoint)
    if stored in ("bfloat16", "float16"):
        flags = kernels.cpu_flags() if cpu_flags is None else cpu_flags
        if any(f in flags for f in BF16_FLAGS):
            return Precision(dtype, torch.bfloat16, False, f"a {stored} checkpoint on a CPU with AVX512_BF16")
        return Precision(
            dtype, torch.float32, False, f"a {stored} checkpoint, and this CPU has no bf16 matmul"
        )
    return Precision(dtype, torch.float32, False, f"a {stored or 'float32'} checkpoint")


def weights_summary(model: torch.nn.Module) -> str:
    """How the linear layers run: e.g. "4-bit g32 (w4a8 kernel) x210"."""
    kinds: dict[str, int] = {}
    for module in (m for m in model.modules() if m is not model.lm_head_t):
        if isinstance(module, QuantizedLinear) and module.kernel == "gguf":
            key = f"{'+'.join(module.gguf.types)} (GGUF kernel)"
        elif isinstance(module, QuantizedLinear) and module.kernel != "dense":
            key = f"{module.bits}-bit g{module.group_size} ({module.kernel} kernel)"
        elif isinstance(module, QuantizedLinear):
            key = "dequantized fp32"
        else:
            continue
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{key} x{n}" for key, n in kinds.items())


def startup_line(
    precision: Precision, model: torch.nn.Module, kv_dtype: torch.dtype, use_kernels: bool, kv_tokens: int
) -> str:
    """The one line `llmopt serve` prints at start-up about what runs in which format, and why."""
    compute = str(precision.compute).removeprefix("torch.")
    quantized = weights_summary(model)
    weights = quantized or compute
    head = model.lm_head_t
    head_text = f"{compute} (dense)"
    if isinstance(head, QuantizedLinear) and head.kernel == "gguf":
        head_text = f"{'+'.join(head.gguf.types)} (GGUF kernel)"
    elif isinstance(head, QuantizedLinear):
        head_text = f"int8 g{head.group_size} ({head.kernel} kernel)"
    kv = str(kv_dtype).removeprefix("torch.")
    isa = kernels.vector_isa() if use_kernels else "PyTorch ops (no compiled kernels)"
    return (
        f"--dtype {precision.asked}: weights {weights} [{precision.reason}]; lm_head {head_text}; "
        f"activations {compute}; KV cache {kv}, {kv_tokens:,} tokens; kernels {isa}"
    )
