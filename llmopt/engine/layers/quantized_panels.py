"""The layout of the engine's int4 / int8 matmul kernel (llmopt/engine/kernels/quantized_matmul.cpp):
weights in panels of 16 output columns, interleaved by quads of 4 inputs, with fp32 scales and
scale-times-zero terms per group, so the kernel streams each panel once per call for all rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmopt.engine.formats.quantized_weight import QuantizedWeight

COLUMNS = 16  # output columns per panel (kCols in quantized_matmul.cpp)
BLOCK = 32  # inputs per activation scale (kBlock): group sizes must be multiples of it, or SMALL_GROUP
SMALL_GROUP = 16  # Q6_K's groups (kSmallGroup): activation blocks of 16 for such a weight
QUAD = 4  # inputs of one column side by side: one int32 lane of the integer dot product
INT8_OFFSET = 128  # int8 weights are stored as q - 128 (signed), so the zero-point term shifts by it


@dataclass
class QuantizedPanels:
    """The packed weight as the kernel reads it."""

    packed: torch.Tensor  # [panels, in * 16 * bits / 8]: uint8 for 4 bits, int8 for 8 bits
    scales: torch.Tensor  # [panels, groups, 2, 16] fp32: scale, then scale * zero (in stored units)
    bits: int
    in_features: int

    @property
    def out_features(self) -> int:
        return self.packed.shape[0] * COLUMNS

    def dequantize(self) -> torch.Tensor:
        """fp32 weight [out, in], rebuilt from the packed copy."""
        panels, in_features = self.packed.shape[0], self.in_features
        quads = self.packed.view(panels, in_features // QUAD, -1)
        if self.bits == 4:
            quads = torch.cat((quads & 15, quads >> 4), dim=2)
        q = quads.view(panels, in_features // QUAD, COLUMNS, QUAD).permute(0, 2, 1, 3).float()
        q = q.reshape(self.out_features, in_features)
        scale, scaled_zero = self.scales.permute(0, 3, 1, 2).reshape(self.out_features, -1, 2).unbind(2)
        group = in_features // scale.shape[1]
        return q * scale.repeat_interleave(group, 1) - scaled_zero.repeat_interleave(group, 1)


def fits(weight: QuantizedWeight) -> bool:
    """Whether the kernel takes this weight: 4 bits, or up to 8 stored as int8 (Q6_K's 6); groups of
    whole activation blocks, or of SMALL_GROUP (then the activations take blocks of 16 too)."""
    out_features, in_features = weight.q.shape
    return (
        weight.bits in (4, 6, 8)
        and out_features % COLUMNS == 0
        and (weight.group_size % BLOCK == 0 or weight.group_size == SMALL_GROUP)
        and in_features % weight.group_size == 0
    )


def pack(weight: QuantizedWeight) -> QuantizedPanels:
    assert fits(weight), (weight.bits, weight.group_size, tuple(weight.q.shape))
    out_features, in_features = weight.q.shape
    panels = out_features // COLUMNS
    # [out, in] -> [panels, in / 4, 16 columns x 4 inputs]: byte 4c + i of a quad is column c, input i.
    quads = weight.q.view(panels, COLUMNS, in_features // QUAD, QUAD).permute(0, 2, 1, 3)
    quads = quads.reshape(panels, in_features // QUAD, COLUMNS * QUAD)
    if weight.bits == 4:  # columns 8-15 go in the high nibbles of columns 0-7's bytes
        half = COLUMNS * QUAD // 2
        packed = (quads[..., :half] | (quads[..., half:] << 4)).to(torch.uint8)
        zero = weight.zero
    else:
        packed = (quads.to(torch.int16) - INT8_OFFSET).to(torch.int8)
        zero = weight.zero - INT8_OFFSET
    scales = torch.stack((weight.scale, weight.scale * zero), dim=-1)  # [out, groups, 2]
    scales = scales.view(panels, COLUMNS, -1, 2).permute(0, 2, 3, 1).contiguous().float()
    stored_bits = 4 if weight.bits == 4 else 8
    return QuantizedPanels(packed.reshape(panels, -1).contiguous(), scales, stored_bits, in_features)
