"""AutoAWQ's GEMM format: qweight [in, out/8] and qzeros with AWQ's nibble order, scales [groups, out]."""

from __future__ import annotations

import torch

from llmopt.engine.formats.quantized_weight import (
    QuantizedWeight,
    check_group_size,
    grouped,
    unpack_int32_cols,
)

AWQ_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column j of an AWQ int32 is its nibble AWQ_ORDER[j]


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
    check_group_size(
        qconfig.get("group_size", qconfig.get("q_group_size")), q.shape[1], scales.shape[1], prefix
    )
    return grouped(q, scales, zeros, None, bits)
