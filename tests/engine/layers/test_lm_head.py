"""The int8 output layer: per-row symmetric quantization, run by a quantized kernel, chosen by
EngineConfig's lm_head_dtype (the perplexity it costs is measured on the real model:
benchmarks/quantization.py)."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine.config import EngineConfig
from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.lm_head import output_layer, quantize_rows_int8
from llmopt.engine.layers.quantized_linear import QuantizedLinear


def test_rows_quantize_to_int8_within_half_a_step():
    weight = torch.randn(256, 64) * torch.logspace(-2, 1, 256)[:, None]  # rows of very different ranges
    weight[5] = 0  # an all-zero row must not divide by zero
    quantized = quantize_rows_int8(weight)
    assert quantized.bits == 8 and quantized.group_size == 64 and (quantized.zero == 128).all()
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    assert ((quantized.dequantize() - weight).abs() <= step / 2 + 1e-7).all()
    assert quantized.dequantize()[5].eq(0).all()


def test_an_int8_head_runs_quantized_and_gives_the_same_logits():
    torch.manual_seed(0)
    head_t = torch.nn.Parameter(torch.randn(64, 512) * 0.05, requires_grad=False)  # [hidden, vocab]
    hidden = torch.randn(3, 64)
    int8 = output_layer(head_t, "int8")
    assert isinstance(int8, QuantizedLinear) and int8.kernel != "dense"
    fp32_logits, int8_logits = matmul(hidden, head_t), matmul(hidden, int8)
    assert (fp32_logits - int8_logits).abs().max() < 0.02 * fp32_logits.abs().max()
    assert output_layer(head_t, "float32") is head_t and output_layer(head_t, "auto") is head_t
    # "auto" is int8 beside quantized layers (an fp32 model keeps its fp32 head, equal to transformers)
    assert isinstance(output_layer(head_t, "auto", quantized_body=True), QuantizedLinear)
    assert output_layer(head_t, "float32", quantized_body=True) is head_t
    assert output_layer(int8, "int8") is int8  # a head the checkpoint quantized stays as it is


def test_engine_config_names_a_bad_dtype():
    assert EngineConfig(dtype="auto", lm_head_dtype="int8").lm_head_dtype == "int8"
    with pytest.raises(ValueError, match="lm_head_dtype must be auto, float32 or int8, not 'int4'"):
        EngineConfig(lm_head_dtype="int4")
    with pytest.raises(ValueError, match="dtype must be one of auto, float32"):
        EngineConfig(dtype="int4")
