"""The int8 KV cache (--kv-cache-dtype int8) in PyTorch: the layout the compiled kernels share
(int8_kv_attention.cpp), the quantization its writes apply and the dequantization its reads apply.

Each token-head row of the cache is int8 [head_dim + 4]: head_dim values quantized symmetrically
(x = scale * q, scale = max|x| / 127 over the row) followed by the fp32 scale's four bytes. Keeping the
scale in the row keeps the cache one tensor, so block tables, prefix caching and preemption are unchanged.
"""

from __future__ import annotations

import torch

from llmopt.engine.config import KV_CACHE_DTYPES

SCALE_BYTES = 4  # one fp32 scale per token and KV head


def cache_row(head_dim: int, kv_cache_dtype: str, dtype: torch.dtype) -> tuple[int, torch.dtype]:
    """The last dimension and dtype of the cache for --kv-cache-dtype (dtype: the model's)."""
    assert kv_cache_dtype in KV_CACHE_DTYPES
    return (head_dim + SCALE_BYTES, torch.int8) if kv_cache_dtype == "int8" else (head_dim, dtype)


def pool_blocks(
    memory_gb: float, num_layers: int, block_shape: tuple[int, int, int], dtype: torch.dtype
) -> int:
    """KV blocks that fit `memory_gb`, each holding every layer's keys and values of block_shape =
    (block_size, kv_heads, cache row) elements of `dtype` (int8 rows count their scales)."""
    block_size, kv_heads, row = block_shape
    bytes_per_block = 2 * num_layers * block_size * kv_heads * row * dtype.itemsize
    return max(1, int(memory_gb * 2**30) // bytes_per_block)


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows x [..., head_dim] (any float dtype) as int8 cache rows [..., head_dim + 4]."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True) / 127
    # Division (as the kernel does): the same rounding in both paths; an all-zero row stays zero.
    values = torch.round(x / torch.where(scale > 0, scale, 1.0)).clamp_(-127, 127).to(torch.int8)
    return torch.cat((values, scale.view(torch.int8)), -1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 cache rows [..., head_dim + 4] back to [..., head_dim] in `dtype`."""
    assert rows.dtype == torch.int8 and rows.is_contiguous()
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)
