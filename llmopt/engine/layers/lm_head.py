"""The output layer's precision: at 4 bits per weight elsewhere, the tied fp32 [vocab, hidden] head is
the largest read of a decode step, so it can run as int8, symmetric, with one scale per HEAD_GROUP inputs
of a row, which QuantizedLinear runs on the w8a8 panel kernel."""

from __future__ import annotations

import torch

from llmopt.engine import kernels
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers.quantized_linear import QuantizedLinear, kernel_choice

LM_HEAD_DTYPES = ("auto", "float32", "int8")
# Inputs per scale. 32 is a GGUF's Q8_0 block, as the bundled file stores its tied head: requantizing the
# dequantized blocks at 32 gives them back, so the head runs the file's own values. One scale per row
# (576 inputs) had cost the bundled Q4_1 model a mean KLD from fp32 of 0.0055 against 0.0034 (p99 0.021
# against 0.012; llama.cpp's own on the same file and text: 0.0035, benchmarks/kld_llamacpp.py), for
# 3-5 % more decode speed (the scales add 2 bits a weight to the head's read).
HEAD_GROUP = 32


def quantize_head_int8(weight: torch.Tensor, group: int = HEAD_GROUP, rows: int = 2048) -> QuantizedWeight:
    """[out, in] -> int8, symmetric, a scale per `group` inputs of a row (per row where `in` is not a
    multiple of it): q in [1, 255] around zero point 128."""
    out_features, in_features = weight.shape
    group = group if in_features % group == 0 else in_features
    blocks = weight.view(out_features, in_features // group, group)
    low, high = torch.aminmax(blocks, dim=2, keepdim=True)
    scale = torch.maximum(high, -low).clamp_(min=torch.finfo(torch.float32).tiny) / 127
    # A block of rows at a time, in place: no fp32 temporaries the size of the head (49152 x 576 for the
    # default model), which took 0.28-0.51 s of a start to allocate and fill; 0.05 s so.
    q = torch.empty(blocks.shape, dtype=torch.uint8)
    for block, block_scale, dst in zip(blocks.split(rows), scale.split(rows), q.split(rows)):
        dst.copy_(torch.div(block, block_scale).round_().clamp_(-127, 127).add_(128))
    scale = scale.squeeze(2)
    return QuantizedWeight(q.view(out_features, in_features), scale, torch.full_like(scale, 128.0), 8, group)


def output_layer(
    head_t: torch.nn.Parameter | QuantizedLinear, lm_head_dtype: str, quantized_body: bool = False
) -> torch.nn.Parameter | QuantizedLinear:
    """The head [hidden, vocab] as `lm_head_dtype` asks; a head the checkpoint already quantized stays.
    "auto" is int8 where the other linears are quantized (see HEAD_GROUP for what it costs) and fp32
    otherwise: an fp32 model stays token for token equal to transformers."""
    assert lm_head_dtype in LM_HEAD_DTYPES, lm_head_dtype
    if lm_head_dtype == "auto":
        lm_head_dtype = "int8" if quantized_body else "float32"
    if lm_head_dtype == "float32" or isinstance(head_t, QuantizedLinear):
        return head_t
    # Grouped scales run on the panel kernel; ATen's int8 kernel (no compiled kernels) takes one a row.
    group = HEAD_GROUP if kernel_choice() == "auto" and kernels.load() else head_t.shape[0]
    return QuantizedLinear(quantize_head_int8(head_t.detach().t().float(), group), "lm_head")
