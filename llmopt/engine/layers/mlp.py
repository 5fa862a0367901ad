"""The gated (SwiGLU) MLP of Llama-family layers and of every MoE expert: one fused gate/up linear, then
down."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.quantized_linear import QuantizedLinear


def gated_mlp(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor | QuantizedLinear,
    down_weight: torch.Tensor | QuantizedLinear,
    use_kernels: bool,
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)), gate and up fused in one weight (gate's columns first)."""
    gate_up = matmul(x, gate_up_weight)
    if use_kernels:
        act = torch.ops.llmopt.silu_mul(gate_up)
    else:
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.silu(gate) * up
    return matmul(act, down_weight)
