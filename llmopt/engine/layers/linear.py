"""Dense linear layers as the engine stores them: transposed ([in, out]) for MKL, or packed in panels of
32 output columns for the compiled kernel; quantized layers (quantized_linear.py) run through the same
`matmul`."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from llmopt.engine.kernels import cpu_flags
from llmopt.engine.layers.quantized_linear import DEQUANTIZE_FROM_ROWS, QuantizedLinear

PANEL = 32  # output columns per panel of a packed dense weight (kPanel in cpu_kernels.cpp)
# What a model and its layers name their linears; pack_dense_linears re-lays the dense ones among them.
LINEARS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight", "lm_head_t")
NO_SCALES = torch.empty(0)  # the scales slot of a dense weight in decode_layers
# From this many rows on, MKL's batched GEMM over the panels beats the panel kernel. The kernel's
# vector path is AVX-512; on an AVX2-only CPU (compiler-vectorised fallback) measured at 576x1536:
# kernel 0.07 / 0.20 / 0.79 / 12.7 ms against 0.12 / 0.15 / 0.41 / 6.1 ms at 4 / 8 / 32 / 512 rows.
# With AVX-512 the kernel keeps its lead through decode-sized batches and is level with MKL at 512.
PANEL_KERNEL_MAX_ROWS = 127 if "avx512f" in cpu_flags() else 7


def matmul(
    x: torch.Tensor, weight_t: torch.Tensor | QuantizedLinear, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if isinstance(weight_t, QuantizedLinear):
        return weight_t(x, bias)
    if weight_t.dim() == 3:  # packed in panels for the compiled kernel (see pack_panels)
        if x.shape[0] > PANEL_KERNEL_MAX_ROWS:  # [P, M, 32] -> [M, P * 32]
            out = torch.matmul(x, weight_t).permute(1, 0, 2).reshape(x.shape[0], -1)
        else:
            out = torch.ops.llmopt.packed_linear(x, weight_t, weight_t.shape[0] * PANEL)
        return out if bias is None else out.add_(bias)
    # Dense weights are stored transposed ([in, out]): MKL's GEMM on that layout is 2-4x faster than
    # F.linear's [out, in] for the skinny batches of decoding (measured at 16 rows on this CPU).
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def pack_panels(weight_t: torch.Tensor) -> torch.Tensor:
    """[in, out] -> [out / 32, in, 32]: each group of 32 output columns contiguous, as packed_linear
    in llmopt/engine/kernels/cpu_kernels.cpp reads them."""
    k, n = weight_t.shape
    assert n % PANEL == 0, f"{n} output features are not a multiple of {PANEL}"
    return weight_t.view(k, n // PANEL, PANEL).permute(1, 0, 2).contiguous()


def pack_dense_linears(modules: Iterable[torch.nn.Module]) -> None:
    """Re-lay every dense fp32 linear of `modules` in panels for the compiled kernel; quantized ones (and
    a width the panels do not divide) keep theirs."""
    for module in list(modules):
        for name, param in list(module.named_parameters(recurse=False)):
            if name in LINEARS and param.dim() == 2 and param.shape[1] % PANEL == 0:
                setattr(module, name, torch.nn.Parameter(pack_panels(param), requires_grad=False))


def kernel_weights(weight: torch.Tensor | QuantizedLinear) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weight, scales) of a linear as decode_layers takes it; None where it has no compiled kernel."""
    if isinstance(weight, QuantizedLinear):
        return weight.kernel_weights()
    return (weight, NO_SCALES) if weight.dim() == 3 else None


def one_call_linears(
    per_layer: list[tuple[torch.Tensor | QuantizedLinear, ...]],
) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], int] | None:
    """Each layer's linears as a one-call decode step (decode_layers, decode_gemma3_layers) takes them,
    and the most rows it runs; None where a linear has no compiled kernel (the layers then run one by one)."""
    linears = [[kernel_weights(w) for w in weights] for weights in per_layer]
    if any(w is None for weights in linears for w in weights):
        return None
    quantized = any(isinstance(w, QuantizedLinear) for weights in per_layer for w in weights)
    # fp32: one call only while the panel kernel is the faster (PANEL_KERNEL_MAX_ROWS); ATen's quantized
    # kernels dequantize from DEQUANTIZE_FROM_ROWS rows, in Python.
    return linears, DEQUANTIZE_FROM_ROWS - 1 if quantized else PANEL_KERNEL_MAX_ROWS
