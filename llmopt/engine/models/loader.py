"""Weights from a checkpoint folder into the engine's model: safetensors read once, q/k/v and gate/up
fused, linears stored [in, out], quantized layers brought to the canonical form by llmopt/engine/formats."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from llmopt.engine.formats import QuantizedWeight, checkpoint_quantization, take_quantized
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.models.llama import DecoderLayer, LlamaForCausalLM

log = logging.getLogger(__name__)


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else None
    files = files or [p.name for p in sorted(model_dir.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(model_dir / name))
    return weights


class CheckpointWeights:
    """A checkpoint's tensors, popped as the model takes them, so that what is left at the end is what the
    model does not use (an error: it would mean a layer the architecture does not know)."""

    def __init__(self, model_dir: Path, dtype: torch.dtype):
        self.tensors = read_safetensors(model_dir)
        self.qconfig = checkpoint_quantization(model_dir)
        self.dtype = dtype

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        return self.tensors.pop(name).to(self.dtype)

    def param(self, *names: str) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.cat([self.take(n) for n in names]), requires_grad=False)

    def linear(self, prefix: str, *names: str) -> torch.nn.Parameter | QuantizedLinear:
        """One (fused) linear layer from the checkpoint's layers `prefix + name`, stored [in, out]."""
        qconfig = self.qconfig
        quantized = [take_quantized(self.tensors, prefix + n, qconfig) for n in names] if qconfig else []
        if quantized and all(quantized):
            return QuantizedLinear(QuantizedWeight.cat(quantized), prefix + "+".join(names))
        # A dense layer, or (rarely) a fusion of dense and quantized parts: run it dense.
        parts = [
            q.dequantize().to(self.dtype) if q is not None else self.take(prefix + n + ".weight")
            for q, n in zip(quantized or [None] * len(names), names)
        ]
        return torch.nn.Parameter(torch.cat(parts).t().contiguous(), requires_grad=False)

    def drop_activation_scales(self) -> None:
        """Static activation scales of W8A8 checkpoints: the CPU kernels quantize weights only."""
        scales = [n for n in self.tensors if n.endswith((".input_scale", ".input_zero_point"))]
        for name in scales:
            del self.tensors[name]
        groups = (self.qconfig or {}).get("config_groups", {}).values()
        if scales or any(group.get("input_activations") for group in groups):
            log.warning(
                "activation quantization is ignored on CPU: weights stay quantized, activations run in bf16"
            )

    def assert_all_used(self) -> None:
        leftover = [n for n in self.tensors if "rotary_emb" not in n]
        assert not leftover, f"weights the model does not use: {leftover[:5]}"


def set_linear(module: torch.nn.Module, attr: str, value: torch.nn.Parameter | QuantizedLinear) -> None:
    if isinstance(value, QuantizedLinear):
        delattr(module, attr)  # a quantized layer replaces the dense parameter declared in __init__
    setattr(module, attr, value)


def load_layer(layer: DecoderLayer, weights: CheckpointWeights, prefix: str) -> None:
    attn = prefix + "self_attn."
    set_linear(layer, "qkv_weight", weights.linear(attn, "q_proj", "k_proj", "v_proj"))
    if attn + "q_proj.bias" in weights:
        layer.qkv_bias = weights.param(attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias")
    set_linear(layer, "o_weight", weights.linear(attn, "o_proj"))
    set_linear(layer, "gate_up_weight", weights.linear(prefix + "mlp.", "gate_proj", "up_proj"))
    set_linear(layer, "down_weight", weights.linear(prefix + "mlp.", "down_proj"))
    layer.input_norm = weights.param(prefix + "input_layernorm.weight")
    layer.post_attention_norm = weights.param(prefix + "post_attention_layernorm.weight")
    if attn + "q_norm.weight" in weights:
        layer.q_norm = weights.param(attn + "q_norm.weight")
        layer.k_norm = weights.param(attn + "k_norm.weight")


def load_model(model_dir: Path, dtype: torch.dtype) -> LlamaForCausalLM:
    config = AutoConfig.from_pretrained(model_dir)
    weights = CheckpointWeights(model_dir, dtype)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.embed = weights.param("model.embed_tokens.weight")
    model.norm = weights.param("model.norm.weight")
    has_head = any(n.startswith("lm_head.") for n in weights.tensors)
    if has_head and not getattr(config, "tie_word_embeddings", False):
        set_linear(model, "lm_head_t", weights.linear("", "lm_head"))
    else:
        weights.tensors.pop("lm_head.weight", None)
        model.lm_head_t = torch.nn.Parameter(model.embed.t().contiguous(), requires_grad=False)
    for i, layer in enumerate(model.layers):
        load_layer(layer, weights, f"model.layers.{i}.")
    weights.drop_activation_scales()
    weights.assert_all_used()
    return model.eval()
