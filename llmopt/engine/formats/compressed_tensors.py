"""compressed-tensors, as llm-compressor and `llmopt quantize` write it and vLLM loads it:
`pack-quantized` (weight_packed int32, any bits, symmetric or with weight_zero_point) and
`int-quantized` / `naive-quantized` (int8 weight)."""

from __future__ import annotations

import re

import torch

from llmopt.engine.formats.quantized_weight import QuantizedWeight, grouped


def compressed_tensors_args(qconfig: dict, prefix: str) -> dict:
    """The weight quantization arguments of the config group that covers `prefix`."""
    groups = list(qconfig["config_groups"].values())
    layer = prefix.rsplit(".", 1)[-1]

    def covers(target: str) -> bool:
        if target.startswith("re:"):
            return re.match(target[3:], prefix) is not None
        return target in ("Linear", layer, prefix)

    for group in groups:
        if any(covers(t) for t in group["targets"]):
            return group["weights"]
    if len(groups) == 1:
        return groups[0]["weights"]
    raise ValueError(f"no quantization config group covers {prefix}")


def take_compressed_tensors(weights: dict, prefix: str, qconfig: dict) -> QuantizedWeight | None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    if prefix + ".weight_scale" not in weights:
        return None
    args = compressed_tensors_args(qconfig, prefix)
    bits = args["num_bits"]
    if args.get("type", "int") != "int":
        raise ValueError(f"{prefix}: {args.get('type')} weights are not supported (integer only)")
    scale = weights.pop(prefix + ".weight_scale").float()
    if prefix + ".weight_packed" in weights:
        shape = torch.Size(weights.pop(prefix + ".weight_shape").tolist())
        signed = unpack_from_int32(weights.pop(prefix + ".weight_packed"), bits, shape)
    else:
        signed = weights.pop(prefix + ".weight")
    out_features = signed.shape[0]
    scale = scale.reshape(out_features, -1)
    offset = 2 ** (bits - 1)  # compressed-tensors stores signed integers
    zero_point = weights.pop(prefix + ".weight_zero_point", None)
    if zero_point is None:
        zero = torch.full_like(scale, float(offset))
    else:
        if zero_point.dtype == torch.int32:  # pack-quantized packs zero points along the output dim
            zero_point = unpack_from_int32(zero_point, bits, scale.shape, packed_dim=0)
        zero = zero_point.reshape(scale.shape).float() + offset
    q = (signed.to(torch.int16) + offset).to(torch.uint8)
    return grouped(q, scale, zero, weights.pop(prefix + ".weight_g_idx", None), bits)
