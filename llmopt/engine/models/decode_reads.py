"""The bytes of weights one decode step reads from memory: every layer's linears and norms as their
kernels store them (packed 4-bit panels and their scales, int8 rows, fp32 panels), the final norm and the
output layer. The embedding is left out: a step reads one row of it per token. A decode step on a CPU is
bound by these reads, so these bytes over the step's time (a served ITL) is the memory bandwidth the step
implies, which the bench sets beside the machine's (/metrics `llmopt:decode_weight_bytes`). For a sparse
MoE model every expert is counted, an upper bound: a step reads only the experts its tokens chose."""

from __future__ import annotations

import torch

from llmopt.engine.layers.quantized_linear import QuantizedLinear


def weight_bytes(weight: torch.Tensor | QuantizedLinear) -> int:
    return weight.read_bytes() if isinstance(weight, QuantizedLinear) else weight.nbytes


def module_bytes(module: torch.nn.Module) -> int:
    """A module's weights, a quantized linear counted as its kernel stores it, each tensor once."""
    return sum(
        weight_bytes(part)
        if isinstance(part, QuantizedLinear)
        else sum(p.nbytes for p in part.parameters(False))
        for part in module.modules()
    )


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads of `model`'s weights (a Llama-family or Gemma 3 model of models/)."""
    return (
        sum(module_bytes(layer) for layer in model.layers) + model.norm.nbytes + weight_bytes(model.lm_head_t)
    )
