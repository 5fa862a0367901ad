"""Quantized checkpoint formats, each read into the canonical `QuantizedWeight`: compressed-tensors,
GPTQ and AWQ. This module finds a checkpoint's quantization config and dispatches per layer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmopt.engine.formats.awq import take_awq
from llmopt.engine.formats.compressed_tensors import take_compressed_tensors
from llmopt.engine.formats.gptq import take_gptq
from llmopt.engine.formats.quantized_weight import QuantizedWeight


def checkpoint_quantization(model_dir: Path) -> dict | None:
    """The quantization config of a checkpoint folder (None when it is dense): config.json's
    `quantization_config`, or the `quantize_config.json` that older GPTQ tools write beside it."""
    qconfig = json.loads((model_dir / "config.json").read_text()).get("quantization_config")
    legacy = model_dir / "quantize_config.json"
    if not qconfig and legacy.is_file():
        qconfig = {"quant_method": "gptq", **json.loads(legacy.read_text())}
    if not qconfig:
        return None
    method = qconfig.get("quant_method")
    if method not in ("compressed-tensors", "gptq", "awq"):
        raise ValueError(
            f"quantization method {method!r} is not supported: llmopt serves compressed-tensors, GPTQ and AWQ"
        )
    return qconfig


def take_quantized(weights: dict[str, torch.Tensor], prefix: str, qconfig: dict) -> QuantizedWeight | None:
    """Pop the tensors of the linear layer `prefix` (e.g. 'model.layers.0.self_attn.q_proj') and return
    its canonical form, or None when that layer is stored dense (an ignored layer)."""
    method = qconfig["quant_method"]
    if method == "compressed-tensors":
        return take_compressed_tensors(weights, prefix, qconfig)
    if prefix + ".qweight" not in weights:
        return None
    if method == "gptq":
        return take_gptq(weights, prefix, qconfig)
    return take_awq(weights, prefix, qconfig)
