"""A checkpoint's tensors as the loader takes them: a folder's safetensors read once, or a GGUF file's
read one at a time (its quantized linears kept as the file has them), popped as the model takes each,
fused linears brought to the canonical quantized form by llmopt/engine/formats. Shared by loader.py and
moe_loader.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from llmopt.checkpoints import is_gguf
from llmopt.engine.formats import QuantizedWeight, checkpoint_quantization, take_quantized
from llmopt.engine.formats.gguf import DENSE_TYPES, GGUFBlocks, GGUFTensors
from llmopt.engine.layers import gguf_panels
from llmopt.engine.layers.embedding import QuantizedEmbedding
from llmopt.engine.layers.gguf_panels import GGUFPanels
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.models.model_config import read_model_config
from llmopt.gguf_file import read_gguf_file

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
    model does not use (an error: it would mean a layer the architecture does not know). A folder's
    safetensors are read at once; a GGUF's tensors one at a time, as they are taken (`native`: its
    quantized linears kept quantized, else every tensor dequantized to `dtype`; `q4_0`: those on a finer
    grid than Q4_0 requantized to it, formats/gguf.py)."""

    def __init__(self, checkpoint: Path, dtype: torch.dtype, native: bool = True, q4_0: bool = False):
        self.dtype = dtype
        self.gguf: GGUFTensors | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.qconfig = None
        if is_gguf(checkpoint):
            config = read_model_config(checkpoint)
            heads = config.num_attention_heads, config.num_key_value_heads
            self.gguf = GGUFTensors(read_gguf_file(checkpoint), *heads, native, q4_0)
        else:
            self.tensors = read_safetensors(checkpoint)
            self.qconfig = checkpoint_quantization(checkpoint)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors or (self.gguf is not None and name in self.gguf)

    def take(self, name: str) -> torch.Tensor:
        value = (
            self.gguf.take(name) if self.gguf is not None and name in self.gguf else self.tensors.pop(name)
        )
        if isinstance(value, QuantizedWeight):  # a GGUF linear read where a dense tensor is wanted
            value = value.dequantize()
        return value.to(self.dtype)

    def discard(self, name: str) -> None:
        """Drop a tensor the model does not read (a tied output layer's copy)."""
        self.tensors.pop(name, None)
        if self.gguf is not None:
            self.gguf.infos.pop(name, None)

    def param(self, *names: str) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.cat([self.take(n) for n in names]), requires_grad=False)

    def embedding(self, name: str) -> torch.nn.Parameter | QuantizedEmbedding:
        """The token embedding: a GGUF's quantized table stays as its blocks."""
        if self.gguf is not None and self.gguf.native and self.gguf.infos[name].type not in DENSE_TYPES:
            hidden_size = self.gguf.infos[name].shape[1]
            return QuantizedEmbedding(*self.gguf.raw_blocks(name), hidden_size)
        return self.param(name)

    def quantized(self, prefix: str, name: str) -> GGUFBlocks | QuantizedWeight | None:
        """Layer `prefix + name`'s weight quantized (a GGUF's blocks as the file has them), or None where
        it is dense."""
        if self.gguf is not None:
            weight = prefix + name + ".weight"
            return self.gguf.take(weight) if self.gguf.quantized_linear(weight) else None
        return take_quantized(self.tensors, prefix + name, self.qconfig) if self.qconfig else None

    def linear(self, prefix: str, *names: str) -> torch.nn.Parameter | QuantizedLinear:
        """One (fused) linear layer from the checkpoint's layers `prefix + name`, stored [in, out]."""
        quantized = [self.quantized(prefix, n) for n in names]
        if all(quantized) and (layer := quantized_linear(quantized, prefix + "+".join(names))) is not None:
            return layer
        # A dense layer, or (rarely) a fusion of dense and quantized parts: run it dense.
        parts = [
            canonical(q).dequantize().to(self.dtype) if q is not None else self.take(prefix + n + ".weight")
            for q, n in zip(quantized, names)
        ]
        return torch.nn.Parameter(torch.cat(parts).t().contiguous(), requires_grad=False)

    def tied_head(self) -> QuantizedLinear | None:
        """A GGUF's output layer tied to its quantized embedding, as the embedding's own blocks (what
        llama.cpp multiplies by); None for any other checkpoint."""
        head = self.gguf.tied_head() if self.gguf is not None else None
        return quantized_linear([head], "lm_head") if head is not None else None

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
        leftover += list(self.gguf.names()) if self.gguf is not None else []
        assert not leftover, f"weights the model does not use: {leftover[:5]}"
        if self.gguf is not None:
            self.gguf.log_conversions()


def canonical(weight: GGUFBlocks | QuantizedWeight) -> QuantizedWeight:
    return weight.canonical() if isinstance(weight, GGUFBlocks) else weight


def quantized_linear(parts: list[GGUFBlocks | QuantizedWeight], label: str) -> QuantizedLinear | None:
    """Quantized parts fused into one layer: a GGUF's blocks on the GGUF kernel, each part at its own
    width, where this CPU runs it; else the canonical form (None where the parts' groups do not fuse)."""
    if all(isinstance(p, GGUFBlocks) and gguf_panels.fits(p) for p in parts) and gguf_panels.supported():
        return QuantizedLinear(GGUFPanels.cat([gguf_panels.pack(p) for p in parts]), label)
    fused = QuantizedWeight.cat([canonical(p) for p in parts])
    return QuantizedLinear(fused, label) if fused is not None else None


def set_linear(
    module: torch.nn.Module, attr: str, value: torch.nn.Parameter | QuantizedLinear | QuantizedEmbedding
) -> None:
    if not isinstance(value, torch.nn.Parameter):
        delattr(module, attr)  # a quantized layer replaces the dense parameter declared in __init__
    setattr(module, attr, value)
