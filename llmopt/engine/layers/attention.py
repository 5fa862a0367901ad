"""Attention over the paged KV cache: the metadata a step's batch attends with, and the two groups it
attends in (decode rows through the compiled kernel or SDPA, padded prefill chunks through SDPA)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    """Queries attended together, keys read through block tables. The decode group has one row per
    query (B = its tokens, Q = 1); the prefill group one per sequence, queries padded to [B, Q]."""

    block_tables: torch.Tensor  # [B, blocks_per_seq] block ids, padded with block 0
    context_lens: torch.Tensor  # [B] tokens each row attends to
    mask: torch.Tensor | None  # [B, 1, Q, blocks_per_seq * block_size] True where a query may attend
    query_index: torch.Tensor | None  # [B, Q] flat rows of the group's queries (None: one query each)
    valid_index: torch.Tensor | None  # [tokens] positions of real queries in the padded [B * Q] rows


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
) -> torch.Tensor:
    """Attention output [T, heads, head_dim] of the batch's queries q [T, heads, head_dim], whose keys and
    values are already in the cache: decode rows first (meta.num_decode_tokens), then the prefill group."""
    out = torch.empty_like(q)
    n_dec = meta.num_decode_tokens
    if meta.decode is not None and meta.use_kernels:
        out[:n_dec] = torch.ops.llmopt.paged_decode_attention(
            q[:n_dec].contiguous(),
            k_cache,
            v_cache,
            meta.decode.block_tables,
            meta.decode.context_lens,
            head_dim**-0.5,
        )
    elif meta.decode is not None:
        out[:n_dec] = attend_decode(q[:n_dec], k_cache, v_cache, meta.decode, num_kv_heads)
    if meta.prefill is not None:
        out[n_dec:] = attend_prefill(q[n_dec:], k_cache, v_cache, meta.prefill)
    return out


def gather(cache: torch.Tensor, group: AttentionGroup, batch: int) -> torch.Tensor:
    """[batch, kv_heads, blocks * block_size, head_dim]: each row's blocks, in table order."""
    # index_select copies whole blocks at memcpy speed (3x faster than advanced indexing here).
    blocks = torch.index_select(cache, 0, group.block_tables.flatten())
    return blocks.view(batch, -1, cache.shape[-2], cache.shape[-1]).transpose(1, 2)


def attend_decode(q, k_cache, v_cache, group: AttentionGroup, num_kv_heads: int) -> torch.Tensor:
    # One query per sequence: fold the query heads that share a KV head into that head's query
    # rows, which is an ordinary (non-GQA) attention and the fastest SDPA path on CPU.
    batch, num_heads, head_dim = q.shape
    k, v = gather(k_cache, group, batch), gather(v_cache, group, batch)
    qf = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=group.mask)
    return out.reshape(batch, num_heads, head_dim)


def attend_prefill(q, k_cache, v_cache, group: AttentionGroup) -> torch.Tensor:
    batch, max_q = group.query_index.shape
    num_heads, head_dim = q.shape[1:]
    k, v = gather(k_cache, group, batch), gather(v_cache, group, batch)
    qp = q[group.query_index].transpose(1, 2)  # [B, heads, Q, head_dim]
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=group.mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(batch * max_q, num_heads, head_dim)[group.valid_index]
