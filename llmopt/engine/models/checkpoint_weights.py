"""A checkpoint's tensors as the loader takes them: a folder's safetensors read once (or a GGUF file's,
its quantized linears kept as the file has them), popped as the model takes each, fused linears brought
to the canonical quantized form by llmopt/engine/formats. Shared by loader.py and moe_loader.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from llmopt.engine.formats import QuantizedWeight, checkpoint_quantization, take_quantized
from llmopt.engine.formats.gguf_cache import read_gguf_cached
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.models.model_config import read_model_config

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

    def __init__(self, model_dir: Path, dtype: torch.dtype, gguf: Path | None = None):
        # From a GGUF file, its quantized linears (by layer prefix) are kept as the file has them.
        self.native: dict[str, QuantizedWeight] = {}
        if gguf is None:
            self.tensors = read_safetensors(model_dir)
            self.qconfig = checkpoint_quantization(model_dir)
        else:
            config = read_model_config(model_dir)
            heads = config.num_attention_heads, config.num_key_value_heads
            self.tensors, self.native = read_gguf_cached(gguf, *heads)
            self.qconfig = None
        self.gguf = gguf
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
        if self.gguf:
            quantized = [self.native.pop(prefix + n, None) for n in names]
        fused = QuantizedWeight.cat(quantized) if quantized and all(quantized) else None
        if fused is not None:
            return QuantizedLinear(fused, prefix + "+".join(names))
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
        leftover = [n for n in self.tensors if "rotary_emb" not in n] + list(self.native)
        assert not leftover, f"weights the model does not use: {leftover[:5]}"


def set_linear(module: torch.nn.Module, attr: str, value: torch.nn.Parameter | QuantizedLinear) -> None:
    if isinstance(value, QuantizedLinear):
        delattr(module, attr)  # a quantized layer replaces the dense parameter declared in __init__
    setattr(module, attr, value)
