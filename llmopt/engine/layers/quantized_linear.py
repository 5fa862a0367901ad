"""Quantized linear layers for the engine: read the checkpoint formats users have, run them with
PyTorch's CPU weight-only kernels.

Every format is first brought to one canonical form, `QuantizedWeight` (unsigned integers with a scale
and a zero point per group of input columns: w = (q - zero) * scale), so the engine can fuse q/k/v and
gate/up of quantized models exactly as it does for dense ones, and so one code path picks the kernel.

Formats read:
- compressed-tensors (what llm-compressor and `llmopt quantize` write, what vLLM loads):
  `pack-quantized` (weight_packed int32, any bits, symmetric or with weight_zero_point) and
  `int-quantized` / `naive-quantized` (int8 weight).
- GPTQ as GPTQModel and AutoGPTQ write it: qweight [in/8, out], qzeros [groups, out/8] (v1 stores
  zero - 1), scales [groups, out], g_idx.
- AutoAWQ's GEMM format: qweight [in, out/8] and qzeros with AWQ's nibble order, scales [groups, out].
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what aten's CPU int4 kernel accepts
# From this many rows on (prefill), dequantizing a layer and running fp32 GEMM beats the weight-only
# kernels, which are built for decode (measured at 512 rows: int4 kernel 2.2x slower than fp32 GEMM).
DEQUANTIZE_FROM_ROWS = 128
AWQ_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column j of an AWQ int32 is its nibble AWQ_ORDER[j]


@dataclass
class QuantizedWeight:
    """Integers in [0, 2**bits) with a scale and zero point per group of input columns."""

    q: torch.Tensor  # uint8 [out, in]
    scale: torch.Tensor  # float32 [out, in // group_size]
    zero: torch.Tensor  # float32 [out, in // group_size], in units of q
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        out_features, in_features = self.q.shape
        assert in_features % self.group_size == 0, (in_features, self.group_size)
        assert self.scale.shape == self.zero.shape == (out_features, in_features // self.group_size)

    def dequantize(self) -> torch.Tensor:
        """fp32 weight [out, in]."""
        scale = self.scale.repeat_interleave(self.group_size, dim=1)
        zero = self.zero.repeat_interleave(self.group_size, dim=1)
        return (self.q.float() - zero) * scale

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """Stack along the output dimension (fused q/k/v or gate/up)."""
        assert len({(p.bits, p.group_size) for p in parts}) == 1, "fused parts differ in bits or groups"
        return QuantizedWeight(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.zero for p in parts]),
            parts[0].bits,
            parts[0].group_size,
        )


class QuantizedLinear(torch.nn.Module):
    """y = x @ W^T with W kept quantized. The kernels want bf16 activations (with fp32 ones they are
    20-40x slower here), so activations are cast around the matmul and the engine stays fp32."""

    def __init__(self, weight: QuantizedWeight, name: str = ""):
        super().__init__()
        out_features, in_features = weight.q.shape
        self.out_features, self.in_features = out_features, in_features
        self.group_size = weight.group_size
        symmetric = bool((weight.zero == 2 ** (weight.bits - 1)).all())
        if weight.bits == 4 and weight.group_size in INT4_GROUP_SIZES and out_features % 64 == 0:
            self.kernel = "int4"
            self.packed = torch._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
            # The kernel computes (q - 8) * scale + offset per group: offset = (8 - zero) * scale.
            self.scale_t = weight.scale.t().contiguous()  # [groups, out]
            self.offset_t = ((8 - weight.zero) * weight.scale).t().contiguous()
            self.scales_and_zeros = torch.stack((self.scale_t, self.offset_t), dim=-1).bfloat16().contiguous()
        elif weight.bits == 8 and weight.group_size == in_features and symmetric:
            self.kernel = "int8"
            self.packed = (weight.q.to(torch.int16) - 128).to(torch.int8).contiguous()
            self.scale = weight.scale[:, 0].contiguous()
            self.scale_bf16 = self.scale.bfloat16()
        else:
            self.kernel = "dense"
            self.weight_t = weight.dequantize().t().contiguous()
            log.warning(
                "%s: no CPU kernel for %d-bit weights with group size %d%s; running it dequantized (fp32)",
                name or "layer",
                weight.bits,
                weight.group_size,
                "" if symmetric else " and zero points",
            )

    def kernel_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(packed weight, bf16 scales) as the engine's compiled decode_layers takes them; None for a
        layer that runs dequantized."""
        if self.kernel == "int8":
            return self.packed, self.scale_bf16
        if self.kernel == "int4":
            return self.packed, self.scales_and_zeros
        return None

    def dequantized_t(self) -> torch.Tensor:
        """The fp32 weight [in, out], rebuilt from the kernel's own packed copy (no second copy kept)."""
        if self.kernel == "int8":
            return self.packed.t().float() * self.scale
        if self.kernel == "dense":
            return self.weight_t
        out_features, in_features, group = self.out_features, self.in_features, self.group_size
        # aten's CPU int4 layout: output rows in blocks of B; byte j of input column k in a block holds
        # row j (low nibble) and row B/2 + j (high nibble) of that block. B depends on the CPU capability
        # torch dispatches to (64 for AVX-512, 32 for AVX2), so it is read off the kernel itself.
        block = int4_pack_block()
        nibbles = self.packed.view(out_features // block, in_features, block // 2)
        q = torch.cat((nibbles & 15, nibbles >> 4), dim=2).permute(1, 0, 2).reshape(in_features, out_features)
        q = q.view(in_features // group, group, out_features).float() - 8
        return torch.addcmul(self.offset_t[:, None], q, self.scale_t[:, None]).view(in_features, out_features)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.kernel == "dense" or x.shape[0] >= DEQUANTIZE_FROM_ROWS:
            y = torch.mm(x, self.dequantized_t().to(x.dtype))
        elif self.kernel == "int4":
            y = torch._weight_int4pack_mm_for_cpu(
                x.bfloat16(), self.packed, self.group_size, self.scales_and_zeros
            )
        else:
            y = torch._weight_int8pack_mm(x.bfloat16(), self.packed, self.scale_bf16)
        y = y.to(x.dtype)
        return y if bias is None else y + bias


@functools.cache
def int4_pack_block() -> int:
    """Output rows per block of `torch._convert_weight_to_int4pack_for_cpu`'s layout on this machine:
    pack a probe whose only non-zero is row 16 of column 0 and see where it lands."""
    probe = torch.zeros(64, 32, dtype=torch.int32)
    probe[16, 0] = 1
    packed = torch._convert_weight_to_int4pack_for_cpu(probe, 1).flatten()
    return 32 if int(packed[0]) == 16 else 64  # with 32-row blocks row 16 is byte 0's high nibble


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


def grouped(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, g_idx: torch.Tensor | None, bits: int
) -> QuantizedWeight:
    """Canonical weight from [out, in] integers and [out, groups] scales and zeros. Act-order
    checkpoints assign input columns to groups out of order (g_idx); the kernels need contiguous
    groups, so such a layer gets a scale per column (group size 1: exact, run by the dense fallback)."""
    q = q.to(torch.uint8)
    in_features = q.shape[1]
    group_size = in_features // scale.shape[1]
    if g_idx is None or torch.equal(g_idx.long(), torch.arange(in_features) // group_size):
        return QuantizedWeight(q, scale.contiguous(), zero.contiguous(), bits, group_size)
    g_idx = g_idx.long()
    return QuantizedWeight(q, scale[:, g_idx], zero[:, g_idx], bits, 1)


def unpack_int32_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] int32 holding 32/bits values each along the rows -> [R * 32/bits, C] (value k of a word
    is row 32/bits * r + k, lowest bits first), as GPTQ packs qweight."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (packed.unsqueeze(1) >> shifts[None, :, None]) & (2**bits - 1)
    return values.reshape(packed.shape[0] * per_word, packed.shape[1])


def unpack_int32_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] int32 -> [R, C * 32/bits], value k of word c being column 32/bits * c + k."""
    return unpack_int32_rows(packed.t().contiguous(), bits).t()


def take_gptq(weights: dict, prefix: str, qconfig: dict) -> QuantizedWeight:
    bits = qconfig["bits"]
    if bits not in (2, 4, 8):
        raise ValueError(f"GPTQ with {bits} bits is not supported (2, 4 or 8)")
    q = unpack_int32_rows(weights.pop(prefix + ".qweight"), bits).t()  # [out, in]
    zeros = unpack_int32_cols(weights.pop(prefix + ".qzeros"), bits)  # [groups, out]
    scales = weights.pop(prefix + ".scales").float()  # [groups, out]
    if qconfig.get("checkpoint_format", "gptq") == "gptq":
        zeros = zeros + 1  # GPTQ v1 stores zero - 1
    zeros = zeros[:, : q.shape[0]].t().float()
    return grouped(q, scales.t(), zeros, weights.pop(prefix + ".g_idx", None), bits)


def take_awq(weights: dict, prefix: str, qconfig: dict) -> QuantizedWeight:
    bits = qconfig.get("bits", qconfig.get("w_bit", 4))
    if bits != 4 or qconfig.get("version", "gemm").lower() != "gemm":
        raise ValueError("only AutoAWQ's 4-bit GEMM format is supported")
    order = torch.tensor(AWQ_ORDER)

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        values = unpack_int32_cols(packed, bits)  # columns in AWQ's interleaved order
        rows, cols = values.shape
        return values.view(rows, cols // 8, 8)[:, :, order].reshape(rows, cols)

    q = unpack(weights.pop(prefix + ".qweight")).t()  # [out, in]
    zeros = unpack(weights.pop(prefix + ".qzeros")).t().float()  # [out, groups]
    scales = weights.pop(prefix + ".scales").float().t()
    return grouped(q, scales, zeros, None, bits)
