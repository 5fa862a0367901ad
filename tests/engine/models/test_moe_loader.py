"""A MoE checkpoint's weights into the engine's model: the per-expert layout save_pretrained writes and
transformers' fused 3-D expert tensors load the same weights; a MoE layer without its router is a clear
error. Model-free (no tokenizer, no generation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, MixtralConfig

from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.models.loader import load_model
from llmopt.engine.models.moe import MoeDecoderLayer

EXPERTS = 4


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory) -> Path:
    config = MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=EXPERTS,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mixtral")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def rewrite(source: Path, target: Path, change) -> Path:
    target.mkdir()
    (target / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    save_file(change(tensors), target / "model.safetensors")
    return target


def fused(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' in-memory layout: mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]."""
    out = {}
    for layer in range(2):
        old = f"model.layers.{layer}.block_sparse_moe."
        new = f"model.layers.{layer}.mlp."
        out[new + "gate.weight"] = tensors.pop(old + "gate.weight")
        w = {
            n: [tensors.pop(f"{old}experts.{e}.{n}.weight") for e in range(EXPERTS)]
            for n in ("w1", "w2", "w3")
        }
        out[new + "experts.gate_up_proj"] = torch.stack([torch.cat(p) for p in zip(w["w1"], w["w3"])])
        out[new + "experts.down_proj"] = torch.stack(w["w2"])
    return {**tensors, **out}


def test_fused_expert_tensors_load_as_the_per_expert_layout(mixtral_dir, tmp_path):
    per_expert = load_model(mixtral_dir, torch.float32)
    from_fused = load_model(rewrite(mixtral_dir, tmp_path / "fused", fused), torch.float32)
    assert all(isinstance(layer, MoeDecoderLayer) for layer in per_expert.layers)
    for a, b in zip(per_expert.layers, from_fused.layers):
        torch.testing.assert_close(a.moe.router_t, b.moe.router_t, rtol=0, atol=0)
        for ea, eb in zip(a.moe.experts, b.moe.experts):
            torch.testing.assert_close(ea.gate_up_weight, eb.gate_up_weight, rtol=0, atol=0)
            torch.testing.assert_close(ea.down_weight, eb.down_weight, rtol=0, atol=0)


def test_a_moe_layer_without_its_router_is_a_clear_error(mixtral_dir, tmp_path):
    def drop_router(tensors):
        del tensors["model.layers.1.block_sparse_moe.gate.weight"]
        return tensors

    broken = rewrite(mixtral_dir, tmp_path / "no-router", drop_router)
    with pytest.raises(ValueError, match="model.layers.1.: a mixture-of-experts layer without a router"):
        load_model(broken, torch.float32)


INT8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {"experts": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}},
}


def int8_experts(tensors: dict[str, torch.Tensor], quantized: bool) -> dict[str, torch.Tensor]:
    """Every expert linear rounded to int8 per output channel: stored as compressed-tensors'
    `int-quantized` (quantized=True) or as the same integers dequantized to fp32 (the reference)."""
    out = {}
    for name, w in tensors.items():
        if ".experts." not in name:
            out[name] = w
            continue
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        q = (w / scale).round().clamp(-127, 127)
        if quantized:
            out[name] = q.to(torch.int8)
            out[name.removesuffix(".weight") + ".weight_scale"] = scale
        else:
            out[name] = q * scale
    return out


def test_int8_experts_from_a_checkpoint_agree_with_their_dequantized_weights(mixtral_dir, tmp_path):
    """A compressed-tensors checkpoint whose experts are int8: they load as QuantizedLinear (the router
    and attention stay dense), and every MoE layer's output agrees with the same integers dequantized."""
    quantized = rewrite(mixtral_dir, tmp_path / "int8", lambda t: int8_experts(t, quantized=True))
    config = json.loads((quantized / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**config, "quantization_config": INT8_CONFIG}))
    reference = rewrite(mixtral_dir, tmp_path / "dequantized", lambda t: int8_experts(t, quantized=False))
    model, dense = load_model(quantized, torch.float32), load_model(reference, torch.float32)
    experts = [e for layer in model.layers for e in layer.moe.experts]
    assert all(isinstance(e.gate_up_weight, QuantizedLinear) for e in experts)
    assert all(isinstance(e.down_weight, QuantizedLinear) for e in experts)
    assert not isinstance(model.layers[0].qkv_weight, QuantizedLinear)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    for layer, dense_layer in zip(model.layers, dense.layers):
        got, expected = layer.moe(x, use_kernels=False), dense_layer.moe(x, use_kernels=False)
        # The kernels round activations (int8 or bf16): agreement to that precision, not fp32's.
        error = (got - expected).norm() / expected.norm()
        assert error < 3e-2, f"relative error {error:.4f}"
