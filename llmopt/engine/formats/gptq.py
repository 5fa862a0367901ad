"""GPTQ as GPTQModel and AutoGPTQ write it: qweight [in/8, out], qzeros [groups, out/8] (v1 stores
zero - 1), scales [groups, out], g_idx."""

from __future__ import annotations

from llmopt.engine.formats.quantized_weight import (
    QuantizedWeight,
    check_group_size,
    grouped,
    unpack_int32_cols,
    unpack_int32_rows,
)


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
    check_group_size(qconfig.get("group_size"), q.shape[1], scales.shape[0], prefix)
    return grouped(q, scales.t(), zeros, weights.pop(prefix + ".g_idx", None), bits)
