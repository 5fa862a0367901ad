"""The one canonical form every quantized checkpoint format is read into: unsigned integers with a scale
and a zero point per group of input columns, w = (q - zero) * scale. One form means q/k/v and gate/up fuse
exactly as dense layers do, and one place (layers/quantized_linear.py) picks the kernel."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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

    def regrouped(self, bits: int, group_size: int) -> QuantizedWeight:
        """The same weights stored wider (`bits` >= self.bits: the integers stay) with groups split to
        `group_size` (a divisor of self's: each scale and zero repeats), bit for bit the same values."""
        assert bits >= self.bits and self.group_size % group_size == 0, (self.bits, self.group_size, bits)
        repeat = self.group_size // group_size
        return QuantizedWeight(
            self.q,
            self.scale.repeat_interleave(repeat, dim=1),
            self.zero.repeat_interleave(repeat, dim=1),
            bits,
            group_size,
        )

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight | None:
        """Stack along the output dimension (fused q/k/v or gate/up). Parts of mixed types (a GGUF's
        Q4_K_M puts a Q6_K v beside Q4_K q and k) share the widest bits and the smallest group; None
        where the groups do not divide each other."""
        bits, group_size = max(p.bits for p in parts), min(p.group_size for p in parts)
        if any(p.group_size % group_size for p in parts):
            return None
        parts = [p.regrouped(bits, group_size) for p in parts]
        return QuantizedWeight(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.zero for p in parts]),
            bits,
            group_size,
        )


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


def check_group_size(declared: int | None, in_features: int, groups: int, prefix: str) -> None:
    """A ValueError when the checkpoint's config and its tensors disagree on the group size: the tensors
    alone would serve it, but a config that lies means a checkpoint written wrong (vLLM refuses it too).
    GPTQ writes -1 for one group per output channel."""
    if declared is None:
        return
    expected = 1 if declared == -1 else -(-in_features // declared)
    if groups != expected:
        raise ValueError(
            f"{prefix}: the quantization config says group_size {declared}, but its scales hold {groups} "
            f"groups over {in_features} inputs (group size {in_features // groups})"
        )


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
