"""The output layer's precision: at 4 bits per weight elsewhere, the tied fp32 [vocab, hidden] head is
the largest read of a decode step, so it can run as int8 per output row (symmetric, one scale a row),
which QuantizedLinear runs with ATen's int8 weight-only kernel."""

from __future__ import annotations

import torch

from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers.quantized_linear import QuantizedLinear

LM_HEAD_DTYPES = ("auto", "float32", "int8")


def quantize_rows_int8(weight: torch.Tensor, rows: int = 2048) -> QuantizedWeight:
    """[out, in] -> int8 per output row, symmetric: q in [1, 255] around zero point 128."""
    low, high = torch.aminmax(weight, dim=1, keepdim=True)
    scale = torch.maximum(high, -low).clamp_(min=torch.finfo(torch.float32).tiny) / 127
    # A block of rows at a time, in place: no fp32 temporaries the size of the head (49152 x 576 for the
    # default model), which took 0.28-0.51 s of a warm start to allocate and fill; 0.05 s so.
    q = torch.empty(weight.shape, dtype=torch.uint8)
    for block, block_scale, out in zip(weight.split(rows), scale.split(rows), q.split(rows)):
        out.copy_(torch.div(block, block_scale).round_().clamp_(-127, 127).add_(128))
    return QuantizedWeight(q, scale, torch.full_like(scale, 128.0), 8, weight.shape[1])


def output_layer(
    head_t: torch.nn.Parameter | QuantizedLinear, lm_head_dtype: str, quantized_body: bool = False
) -> torch.nn.Parameter | QuantizedLinear:
    """The head [hidden, vocab] as `lm_head_dtype` asks; a head the checkpoint already quantized stays.
    "auto" is int8 where the other linears are quantized (the int8 head cost +0.14 % perplexity on the
    default model, within the +0.5 % the quantized paths allow) and fp32 otherwise: an fp32 model stays
    token for token equal to transformers."""
    assert lm_head_dtype in LM_HEAD_DTYPES, lm_head_dtype
    if lm_head_dtype == "auto":
        lm_head_dtype = "int8" if quantized_body else "float32"
    if lm_head_dtype == "float32" or isinstance(head_t, QuantizedLinear):
        return head_t
    return QuantizedLinear(quantize_rows_int8(head_t.detach().t().float()), "lm_head")
