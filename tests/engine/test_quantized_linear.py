"""Checkpoint formats to the canonical form, the CPU kernels, and serving other tools' formats."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from safetensors.torch import load_file, save_file

from llmopt.engine.formats.awq import AWQ_ORDER, take_awq
from llmopt.engine.formats.compressed_tensors import take_compressed_tensors
from llmopt.engine.formats.gptq import take_gptq
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers.quantized_linear import DEQUANTIZE_FROM_ROWS, QuantizedLinear
from llmopt.evaluate.perplexity import engine_scorer


def random_weight(out_features: int = 64, in_features: int = 128, group_size: int = 32, bits: int = 4):
    gen = torch.Generator().manual_seed(0)
    groups = in_features // group_size
    top = 2**bits
    return QuantizedWeight(
        q=torch.randint(0, top, (out_features, in_features), generator=gen).to(torch.uint8),
        scale=torch.rand(out_features, groups, generator=gen) * 0.01 + 0.001,
        zero=torch.randint(1, top, (out_features, groups), generator=gen).float(),
        bits=bits,
        group_size=group_size,
    )


def to_int32(values: torch.Tensor) -> torch.Tensor:
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's packing along rows: [R, C] -> [R * bits / 32, C]."""
    per_word = 32 // bits
    rows, cols = values.shape
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    return to_int32((values.long().view(rows // per_word, per_word, cols) << shifts[None, :, None]).sum(1))


def pack_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_rows(values.t().contiguous(), bits).t().contiguous()


def assert_same(a: QuantizedWeight, b: QuantizedWeight) -> None:
    assert (a.bits, a.group_size) == (b.bits, b.group_size)
    torch.testing.assert_close(a.dequantize(), b.dequantize())


def test_compressed_tensors_pack_quantized_round_trip():
    w = random_weight()
    weights = {
        "l.weight_packed": pack_to_int32((w.q.to(torch.int16) - 8).to(torch.int8), 4),
        "l.weight_shape": torch.tensor(list(w.q.shape)),
        "l.weight_scale": w.scale,
        "l.weight_zero_point": pack_to_int32((w.zero - 8).to(torch.int8), 4, packed_dim=0),
    }
    qconfig = {"config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}}
    assert_same(take_compressed_tensors(weights, "l", qconfig), w)
    assert not weights  # every tensor of the layer was consumed


@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_gptq_round_trip(checkpoint_format):
    w = random_weight()
    stored_zero = w.zero.t().long() - (1 if checkpoint_format == "gptq" else 0)  # v1 stores zero - 1
    weights = {
        "l.qweight": pack_rows(w.q.t().contiguous(), 4),
        "l.qzeros": pack_cols(stored_zero, 4),
        "l.scales": w.scale.t().half(),
        "l.g_idx": torch.arange(128, dtype=torch.int32) // 32,
    }
    got = take_gptq(weights, "l", {"bits": 4, "checkpoint_format": checkpoint_format})
    assert_same(got, QuantizedWeight(w.q, w.scale.half().float(), w.zero, 4, 32))


def test_gptq_act_order_keeps_per_column_groups():
    w = random_weight()
    g_idx = torch.randperm(128, generator=torch.Generator().manual_seed(1)) % 4
    weights = {
        "l.qweight": pack_rows(w.q.t().contiguous(), 4),
        "l.qzeros": pack_cols(w.zero.t().long() - 1, 4),
        "l.scales": w.scale.t().contiguous(),
        "l.g_idx": g_idx.to(torch.int32),
    }
    got = take_gptq(weights, "l", {"bits": 4})
    expected = (w.q.float() - w.zero[:, g_idx]) * w.scale[:, g_idx]
    torch.testing.assert_close(got.dequantize(), expected)
    assert QuantizedLinear(got).kernel == "dense"


def test_awq_round_trip():
    w = random_weight()
    inverse = torch.argsort(torch.tensor(AWQ_ORDER))  # column j sits in nibble AWQ_ORDER[j]

    def awq_pack(values: torch.Tensor) -> torch.Tensor:  # [R, C] -> [R, C/8] in AWQ's nibble order
        rows, cols = values.shape
        return pack_cols(values.view(rows, cols // 8, 8)[:, :, inverse].reshape(rows, cols), 4)

    weights = {
        "l.qweight": awq_pack(w.q.t().contiguous()),
        "l.qzeros": awq_pack(w.zero.t().long()),
        "l.scales": w.scale.t().contiguous(),
    }
    assert_same(take_awq(weights, "l", {"bits": 4, "version": "gemm"}), w)


@pytest.mark.parametrize(
    ("bits", "group_size", "kernel"), [(4, 32, "int4"), (8, 128, "int8"), (4, 16, "dense")]
)
def test_kernels_match_the_dequantized_weight(bits, group_size, kernel, caplog):
    w = random_weight(group_size=group_size, bits=bits)
    if bits == 8:
        w.zero.fill_(128)  # the int8 kernel is symmetric, per channel
    x = torch.randn(5, 128)
    with caplog.at_level(logging.WARNING):
        layer = QuantizedLinear(w, "test", kernel="aten")  # the panel kernel: test_quantized_matmul.py
    assert layer.kernel == kernel
    assert ("running it dequantized" in caplog.text) == (kernel == "dense")
    expected = x @ w.dequantize().t()
    got = layer(x)
    assert got.dtype == torch.float32
    assert (got - expected).norm() / expected.norm() < 0.01
    # Prefill-sized inputs run fp32 GEMM on the weight rebuilt from the kernel's packed copy.
    torch.testing.assert_close(layer.dequantized_t(), w.dequantize().t())
    long_x = torch.randn(DEQUANTIZE_FROM_ROWS, 128)
    torch.testing.assert_close(layer(long_x), long_x @ w.dequantize().t(), rtol=1e-4, atol=1e-4)


def write_other_format(source: Path, target: Path, fmt: str) -> None:
    """Re-pack a compressed-tensors 4-bit checkpoint as GPTQModel (gptq_v2) or AutoAWQ would write it."""
    shutil.copytree(source, target)
    config = json.loads((source / "config.json").read_text())
    qconfig = config["quantization_config"]
    tensors = load_file(source / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    inverse = torch.argsort(torch.tensor(AWQ_ORDER))
    for name in [n for n in tensors if n.endswith(".weight_packed")]:
        prefix = name.removesuffix(".weight_packed")
        w = take_compressed_tensors(tensors, prefix, qconfig)
        if fmt == "gptq":
            out[prefix + ".qweight"] = pack_rows(w.q.t().contiguous(), 4)
            out[prefix + ".qzeros"] = pack_cols(w.zero.t().long(), 4)
        else:
            for key, values in (("qweight", w.q.t().contiguous()), ("qzeros", w.zero.t().long())):
                rows, cols = values.shape
                out[f"{prefix}.{key}"] = pack_cols(
                    values.view(rows, cols // 8, 8)[:, :, inverse].reshape(rows, cols), 4
                )
        out[prefix + ".scales"] = w.scale.t().contiguous()
    out.update(tensors)  # the dense rest: embeddings, norms
    save_file(out, target / "model.safetensors")
    config["quantization_config"] = (
        {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,  # the AWQ checkpoint it re-packs
            "checkpoint_format": "gptq_v2",
            "desc_act": False,
        }
        if fmt == "gptq"
        else {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    )
    (target / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_gptqmodel_and_autoawq_checkpoints_serve_like_the_original(fmt, awq_dir, tmp_path, llm):
    other = tmp_path / fmt
    write_other_format(awq_dir, other, fmt)
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    torch.testing.assert_close(engine_scorer(other, 64)(ids), engine_scorer(awq_dir, 64)(ids))


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_a_config_whose_group_size_disagrees_with_the_tensors_is_refused(fmt):
    """64 inputs in 2 groups is group size 32; a config claiming 64 is a checkpoint written wrong."""
    from llmopt.engine.formats.awq import take_awq
    from llmopt.engine.formats.gptq import take_gptq

    def tensors() -> dict:
        if fmt == "gptq":  # qweight [in/8, out], qzeros [groups, out/8], scales [groups, out]
            shapes = {"qweight": (8, 8), "qzeros": (2, 1), "scales": (2, 8)}
        else:  # qweight [in, out/8], qzeros [groups, out/8], scales [groups, out]
            shapes = {"qweight": (64, 1), "qzeros": (2, 1), "scales": (2, 8)}
        return {
            f"l.{k}": torch.ones(shape) if k == "scales" else torch.zeros(shape, dtype=torch.int32)
            for k, shape in shapes.items()
        }

    take = take_gptq if fmt == "gptq" else take_awq
    assert take(tensors(), "l", {"bits": 4, "group_size": 32}).group_size == 32
    with pytest.raises(ValueError, match="says group_size 64, but its scales hold 2 groups over 64 inputs"):
        take(tensors(), "l", {"bits": 4, "group_size": 64})


def test_unsupported_quantization_method_is_a_clear_error(model_dir, tmp_path):
    from llmopt.engine.llm import LLM

    target = tmp_path / "fp8"
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization method 'fp8' is not supported"):
        LLM(str(target))


def test_w8a8_checkpoints_serve_with_int8_weights(tmp_path, model_dir, int8_dir, caplog):
    """llm-compressor's W8A8 (int8 weights in the `int-quantized` format, dynamic per-token int8
    activations): the engine runs the int8 weights with bf16 activations and says so."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    from llmopt.engine.models.loader import load_model
    from llmopt.evaluate.perplexity import perplexity

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]))
    out = tmp_path / "w8a8"
    model.save_pretrained(out, save_compressed=True)
    shutil.copy(model_dir / "tokenizer.json", out)
    shutil.copy(model_dir / "tokenizer_config.json", out)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "int-quantized"
    with caplog.at_level(logging.WARNING):
        engine_model = load_model(out, torch.float32)
    assert "activation quantization is ignored" in caplog.text
    from llmopt.engine import kernels

    kernel = "w8a8" if kernels.load() else "int8"  # the panel kernel (int8 activations), else ATen's
    assert {layer.qkv_weight.kernel for layer in engine_model.layers} == {kernel}
    w8a8 = perplexity(str(out), seq_len=256, num_windows=2)
    w8a16 = perplexity(str(int8_dir), seq_len=256, num_windows=2)
    assert abs(w8a8.perplexity / w8a16.perplexity - 1) < 0.01
