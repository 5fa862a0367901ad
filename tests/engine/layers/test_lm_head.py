"""The int8 output layer: symmetric quantization with a scale per 32 inputs (a GGUF's Q8_0 blocks given
back exactly), run by a quantized kernel, chosen by
EngineConfig's lm_head_dtype (the perplexity it costs is measured on the real model:
benchmarks/quantization.py)."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine.config import EngineConfig
from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.lm_head import HEAD_GROUP, output_layer, quantize_head_int8
from llmopt.engine.layers.quantized_linear import QuantizedLinear


def test_groups_quantize_to_int8_within_half_a_step():
    weight = torch.randn(256, 64) * torch.logspace(-2, 1, 256)[:, None]  # rows of very different ranges
    weight[5] = 0  # an all-zero row must not divide by zero
    weight[7, :32] *= 100  # one group of a row far larger than its other
    quantized = quantize_head_int8(weight)
    assert quantized.bits == 8 and quantized.group_size == HEAD_GROUP and (quantized.zero == 128).all()
    step = weight.view(256, 2, 32).abs().amax(dim=2).repeat_interleave(32, dim=1) / 127
    assert ((quantized.dequantize() - weight).abs() <= step / 2 + 1e-7).all()
    assert quantized.dequantize()[5].eq(0).all()
    assert quantize_head_int8(torch.randn(8, 48)).group_size == 48  # not a multiple of 32: a scale a row


def test_a_q8_0_head_is_given_back_exactly():
    """The bundled GGUF stores its tied head as Q8_0 (blocks of 32, an fp16 scale each): requantized at
    32, its dequantized values come back unchanged, so the int8 head runs the file's own numbers."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    weight = (torch.randn(64, 576) * torch.logspace(-2, 0, 64)[:, None]).numpy()
    kind = GGMLQuantizationType.Q8_0
    q8_0 = torch.from_numpy(dequantize(quantize(weight, kind), kind))
    assert torch.equal(quantize_head_int8(q8_0.float()).dequantize(), q8_0.float())


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
