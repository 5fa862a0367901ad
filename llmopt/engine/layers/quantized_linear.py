"""Quantized linear layers for the engine: a GGUF file's blocks at their own width on the GGUF kernel
(kernels/gguf_matmul.cpp, AVX-512 VNNI), or the canonical quantized weight (llmopt/engine/formats) on the
engine's int4 / int8 panel kernel (int8 activations, kernels/quantized_matmul.cpp) when the compiled
kernels load, at every batch size; else PyTorch's CPU weight-only kernels (dequantized for prefill-sized
batches), or dequantized where no kernel fits. LLMOPT_QUANT_KERNEL=aten keeps PyTorch's kernels (bf16
activations), for checking."""

from __future__ import annotations

import functools
import logging
import os

import torch

from llmopt.engine import kernels
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers import quantized_panels
from llmopt.engine.layers.gguf_panels import GGUFPanels

log = logging.getLogger(__name__)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what aten's CPU int4 kernel accepts
# From this many rows on (prefill), dequantizing a layer and running fp32 GEMM beats ATen's weight-only
# kernels, which are built for decode (measured at 512 rows: int4 kernel 2.2x slower than fp32 GEMM).
# The panel kernel runs at every row count: at 512 rows it is 1.6-1.9x faster than fp32 GEMM on the
# dequantized weight, and 3-4x faster than dequantizing it each call then GEMM (AVX-512 VNNI, 576 x
# 3072 and 1536 x 576), and a row's result does not depend on how many rows share its step.
DEQUANTIZE_FROM_ROWS = 128
# LLMOPT_QUANT_KERNEL: auto = the panel kernel where it fits, else ATen's; aten = ATen's weight-only
# kernels; dense = dequantized fp32, the reference the kernels are checked against.
KERNEL_CHOICES = ("auto", "aten", "dense")
PANEL_KERNELS = ("w4a8", "w8a8")


def kernel_choice() -> str:
    choice = os.environ.get("LLMOPT_QUANT_KERNEL", "auto") or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"LLMOPT_QUANT_KERNEL={choice!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    return choice


class QuantizedLinear(torch.nn.Module):
    """y = x @ W^T with W kept quantized. The panel kernel quantizes fp32 activations to int8 itself;
    ATen's kernels want bf16 ones (with fp32 they are 20-40x slower here), so activations are cast
    around those and the engine stays fp32. kernel: one of KERNEL_CHOICES (default: LLMOPT_QUANT_KERNEL)."""

    def __init__(self, weight: QuantizedWeight | GGUFPanels, name: str = "", kernel: str | None = None):
        super().__init__()
        if isinstance(weight, GGUFPanels):
            self.out_features, self.in_features = weight.out_features, weight.in_features
            self.gguf = weight
            self.kernel = "gguf"
            return
        out_features, in_features = weight.q.shape
        self.out_features, self.in_features = out_features, in_features
        self.bits, self.group_size = weight.bits, weight.group_size
        symmetric = bool((weight.zero == 2 ** (weight.bits - 1)).all())
        choice = kernel or kernel_choice()
        assert choice in KERNEL_CHOICES, choice
        if choice == "auto" and quantized_panels.fits(weight) and kernels.load():
            self.panels = quantized_panels.pack(weight)
            self.kernel = f"w{self.panels.bits}a8"
        elif choice == "dense":
            self.kernel = "dense"
            self.weight_t = weight.dequantize().t().contiguous()
        elif weight.bits == 4 and weight.group_size in INT4_GROUP_SIZES and out_features % 64 == 0:
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
        """(packed weight, scales) as the engine's compiled decode_layers takes them (fp32 scales for the
        panel kernel, bf16 for ATen's, the int64 panel index for the GGUF kernel); None for a layer that
        runs dequantized."""
        if self.kernel == "gguf":
            return self.gguf.data, self.gguf.index
        if self.kernel in PANEL_KERNELS:  # fp32 scales: decode_layers' any_linear runs quantized_matmul
            return self.panels.packed, self.panels.scales
        if self.kernel == "int8":
            return self.packed, self.scale_bf16
        if self.kernel == "int4":
            return self.packed, self.scales_and_zeros
        return None

    def read_bytes(self) -> int:
        """Bytes of the weight as its kernel stores it (packed values and scales): what one pass over
        the layer reads from memory."""
        stored = self.kernel_weights()
        return sum(t.nbytes for t in stored) if stored else self.weight_t.nbytes

    def dequantized_t(self) -> torch.Tensor:
        """The fp32 weight [in, out], rebuilt from the kernel's own packed copy (no second copy kept)."""
        if self.kernel == "gguf":
            return self.gguf.dequantize().t()
        if self.kernel in PANEL_KERNELS:
            return self.panels.dequantize().t()
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
        if self.kernel == "gguf":
            y = self.gguf.matmul(x.float())
        elif self.kernel in PANEL_KERNELS:
            y = torch.ops.llmopt.quantized_matmul(x.float(), self.panels.packed, self.panels.scales)
        elif self.kernel == "dense" or x.shape[0] >= DEQUANTIZE_FROM_ROWS:
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
