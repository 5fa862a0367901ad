"""Attention over the paged KV cache: the metadata a step's batch attends with, and the two groups it
attends in (decode rows through the compiled kernel or SDPA, padded prefill chunks through SDPA)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmopt.engine.layers import int8_kv_cache


@dataclass
class AttentionGroup:
    """Queries attended together, keys read through block tables. The decode group has one row per
    query (B = its tokens, Q = 1); the prefill group one per sequence, queries padded to [B, Q]."""

    block_tables: torch.Tensor  # [B, blocks_per_seq] block ids, padded with block 0
    context_lens: torch.Tensor  # [B] tokens each row attends to
    mask: torch.Tensor | None  # [B, 1, Q, blocks_per_seq * block_size] True where a query may attend
    query_index: torch.Tensor | None  # [B, Q] flat rows of the group's queries (None: one query each)
    valid_index: torch.Tensor | None  # [tokens] positions of real queries in the padded [B * Q] rows
    # Every row's queries start at position 0 (nothing cached before them): the mask is plain causal, and
    # SDPA's is_causal, which skips the key blocks above the diagonal, gives the same bits 1.3-1.45x faster
    # (512 and 1,024 fresh tokens, SmolLM2's 9 / 3 heads).
    causal: bool = False
    query_lens: torch.Tensor | None = None  # [B] new tokens per row (prefill group; what the kernel reads)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of every new token
    cos: torch.Tensor  # [T, 1, head_dim]
    sin: torch.Tensor
    num_decode_tokens: int  # the first rows of the batch attend one query row at a time (decode group)
    use_kernels: bool  # compiled kernels (llmopt/engine/csrc) for attention and element-wise steps
    decode: AttentionGroup | None
    prefill: AttentionGroup | None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    num_kv_heads: int,
    head_dim: int,
    window: int = 0,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention output [T, heads, head_dim] of the batch's queries q [T, heads, head_dim], whose keys and
    values are already in the cache: decode rows first (meta.num_decode_tokens), then the prefill group.
    window > 0: each query attends to its last `window` positions only; the SDPA paths read that from
    meta's masks (see `windowed`), the kernels from this argument. scale: head_dim ** -0.5 if None."""
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    n_dec = meta.num_decode_tokens
    if meta.decode is not None and meta.use_kernels:
        # An int8 cache (int8_kv_cache.py) has its own kernel, with the same arguments.
        int8 = k_cache.dtype == torch.int8
        kernel = (
            torch.ops.llmopt.paged_decode_attention_int8 if int8 else torch.ops.llmopt.paged_decode_attention
        )
        out[:n_dec] = kernel(
            q[:n_dec].contiguous(),
            k_cache,
            v_cache,
            meta.decode.block_tables,
            meta.decode.context_lens,
            scale,
            window,
        )
    elif meta.decode is not None:
        out[:n_dec] = attend_decode(q[:n_dec], k_cache, v_cache, meta.decode, num_kv_heads, scale)
    if meta.prefill is not None and meta.use_kernels and k_cache.dtype == torch.float32:
        # Causal and windowed by position in the kernel (prefill_attention.cpp), no mask and no gather.
        group = meta.prefill
        out[n_dec:] = torch.ops.llmopt.paged_prefill_attention(
            q[n_dec:].contiguous(),
            k_cache,
            v_cache,
            group.block_tables,
            group.context_lens,
            group.query_lens,
            scale,
            window,
        )
    elif meta.prefill is not None:
        out[n_dec:] = attend_prefill(q[n_dec:], k_cache, v_cache, meta.prefill, scale)
    return out


def rope_and_cache(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    heads: int,
    kv_heads: int,
    head_dim: int,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The rotated queries [T, heads, head_dim] of qkv [T, (heads + 2 kv_heads) * head_dim]; stores the
    rotated keys and the values at meta.slot_mapping, quantized where the cache is int8 (int8_kv_cache).
    rope: (cos, sin) in place of meta's (models whose layers rotate differently)."""
    cos, sin = rope or (meta.cos, meta.sin)
    int8 = k_cache.dtype == torch.int8
    if meta.use_kernels:  # rotary embedding and the cache writes in one pass
        op = torch.ops.llmopt.rope_and_cache_int8 if int8 else torch.ops.llmopt.rope_and_cache
        return op(qkv, cos, sin, k_cache, v_cache, meta.slot_mapping, heads)
    num_tokens = qkv.shape[0]
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)
    # Rotary embedding on q and k together: one set of ops for both.
    qk = qk * cos + rotate_half(qk) * sin
    q, k = qk[:, :heads], qk[:, heads:]
    if int8:
        k, v = int8_kv_cache.quantize(k), int8_kv_cache.quantize(v)
    k_cache.view(-1, kv_heads, k.shape[-1]).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, v.shape[-1]).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
    return q


def windowed(group: AttentionGroup | None, window: int) -> AttentionGroup | None:
    """The group with its mask narrowed to each query's last `window` positions (sliding-window layers).
    A mask row is causal (True up to the query's own position), so its count locates the query."""
    if group is None or group.mask is None or not window:
        return group
    query_pos = group.mask.sum(-1, keepdim=True) - 1
    key_pos = torch.arange(group.mask.shape[-1])
    return dataclasses.replace(group, mask=group.mask & (key_pos > query_pos - window), causal=False)


def gather(cache: torch.Tensor, group: AttentionGroup, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """[batch, kv_heads, blocks * block_size, head_dim]: each row's blocks, in table order (in `dtype`,
    the queries', where the cache is int8)."""
    # index_select copies whole blocks at memcpy speed (3x faster than advanced indexing here).
    blocks = torch.index_select(cache, 0, group.block_tables.flatten())
    if blocks.dtype == torch.int8:  # gather, then dequantize only the rows read
        blocks = int8_kv_cache.dequantize(blocks, dtype)
    return blocks.view(batch, -1, blocks.shape[-2], blocks.shape[-1]).transpose(1, 2)


def attend_decode(
    q, k_cache, v_cache, group: AttentionGroup, num_kv_heads: int, scale: float
) -> torch.Tensor:
    # One query per sequence: fold the query heads that share a KV head into that head's query
    # rows, which is an ordinary (non-GQA) attention and the fastest SDPA path on CPU.
    batch, num_heads, head_dim = q.shape
    k, v = gather(k_cache, group, batch, q.dtype), gather(v_cache, group, batch, q.dtype)
    qf = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=group.mask, scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def attend_prefill(q, k_cache, v_cache, group: AttentionGroup, scale: float) -> torch.Tensor:
    batch, max_q = group.query_index.shape
    num_heads, head_dim = q.shape[1:]
    k, v = gather(k_cache, group, batch, q.dtype), gather(v_cache, group, batch, q.dtype)
    qp = q[group.query_index].transpose(1, 2)  # [B, heads, Q, head_dim]
    mask = None if group.causal else group.mask
    out = F.scaled_dot_product_attention(
        qp, k, v, attn_mask=mask, is_causal=group.causal, enable_gqa=True, scale=scale
    )
    return out.transpose(1, 2).reshape(batch * max_q, num_heads, head_dim)[group.valid_index]
