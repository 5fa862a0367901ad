"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a paged KV cache.

One batched forward per engine step: the tokens of every scheduled sequence are concatenated into one
flat batch for the linear layers; attention runs in at most two groups (query rows that each attend to
their own context: decodes, speculative verifications and short chunks; and padded prefill chunks),
reading keys and values from the paged cache through block tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from transformers import PretrainedConfig

from llmopt.engine.layers.attention import AttentionMetadata, paged_attention, rope_and_cache
from llmopt.engine.layers.embedding import embed_tokens
from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.mlp import gated_mlp
from llmopt.engine.layers.norm import rms_norm

log = logging.getLogger(__name__)


def one_call_decode(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    op_name: str,
    extra: Callable[[], tuple] = tuple,
) -> torch.Tensor | None:
    """A step of decode rows only, every layer in one compiled call, the kernel op `op_name`
    (decode_layers, or Gemma 3's decode_gemma3_layers with the arguments `extra()` gives: the same kernels
    in the same order, without Python between them), where kernel_layout.py compiled the model's weights
    for it and the rows fit; None where the step must run layer by layer. Llama and Gemma 3 share this
    branch. The op is looked up only when it runs: without compiled kernels there is none."""
    fits = meta.use_kernels and meta.prefill is None and len(hidden) <= model.decode_max_rows
    if not (model.decode_weights and fits):
        return None
    return getattr(torch.ops.llmopt, op_name)(
        hidden,
        model.decode_weights,
        model.config.rms_norm_eps,
        kv_cache,
        meta.cos,
        meta.sin,
        meta.slot_mapping,
        meta.decode.block_tables,
        meta.decode.context_lens,
        model.config.num_attention_heads,
        *extra(),
    )


class DecoderLayer(torch.nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.eps = config.rms_norm_eps
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        hidden = config.hidden_size
        self.qkv_weight = torch.nn.Parameter(torch.empty(q_size + 2 * kv_size, hidden), requires_grad=False)
        self.qkv_bias: torch.nn.Parameter | None = None
        self.o_weight = torch.nn.Parameter(torch.empty(hidden, q_size), requires_grad=False)
        self.gate_up_weight = torch.nn.Parameter(
            torch.empty(2 * config.intermediate_size, hidden), requires_grad=False
        )
        self.down_weight = torch.nn.Parameter(
            torch.empty(hidden, config.intermediate_size), requires_grad=False
        )
        self.input_norm = torch.nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.post_attention_norm = torch.nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.q_norm: torch.nn.Parameter | None = None  # Qwen3 normalizes each head of q and k
        self.k_norm: torch.nn.Parameter | None = None

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = rms_norm(hidden, self.input_norm, self.eps, meta.use_kernels)
        hidden.add_(self.attention(x, kv_cache, meta))
        x = rms_norm(hidden, self.post_attention_norm, self.eps, meta.use_kernels)
        return hidden.add_(self.feed_forward(x, meta.use_kernels))

    def feed_forward(self, x: torch.Tensor, use_kernels: bool) -> torch.Tensor:
        """The MLP after attention (a mixture of experts in models/moe.py overrides it)."""
        return gated_mlp(x, self.gate_up_weight, self.down_weight, use_kernels)

    def attention(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = matmul(x, self.qkv_weight, self.qkv_bias)
        if self.q_norm is not None:
            qk = qkv[:, : (heads + kv_heads) * dim].view(num_tokens, heads + kv_heads, dim)
            q_normed = rms_norm(qk[:, :heads], self.q_norm, self.eps, meta.use_kernels)
            k_normed = rms_norm(qk[:, heads:], self.k_norm, self.eps, meta.use_kernels)
            qkv = torch.cat((q_normed.flatten(1), k_normed.flatten(1), qkv[:, (heads + kv_heads) * dim :]), 1)
        # kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        q = rope_and_cache(qkv, k_cache, v_cache, meta, heads, kv_heads, dim)

        out = paged_attention(q, k_cache, v_cache, meta, kv_heads, dim)
        return matmul(out.view(num_tokens, -1), self.o_weight)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.embed = torch.nn.Parameter(
            torch.empty(config.vocab_size, config.hidden_size), requires_grad=False
        )
        self.layers = torch.nn.ModuleList(self.make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = torch.nn.Parameter(torch.empty(config.hidden_size), requires_grad=False)
        self.lm_head_t = torch.nn.Parameter(  # [hidden, vocab], transposed like every linear
            torch.empty(config.hidden_size, config.vocab_size), requires_grad=False
        )
        # Set by kernel_layout.py where every layer's linears have a compiled kernel: what decode_layers
        # takes, and the most rows it runs (quantized layers dequantize for large batches, in Python).
        self.decode_weights: list[torch.Tensor] | None = None
        self.decode_max_rows = 0
        self.fused_decode = True  # whether decode_layers can run these layers (dense Llama layers only)

    def make_layer(self, config: PretrainedConfig, index: int) -> DecoderLayer:
        return DecoderLayer(config, self.head_dim)

    def forward(
        self, input_ids: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Return the final hidden states [T, hidden] of the flat batch."""
        hidden = embed_tokens(self.embed, input_ids).to(self.norm.dtype)
        layered = one_call_decode(self, hidden, kv_cache, meta, "decode_layers")
        if layered is not None:
            hidden = layered
        else:
            for i, layer in enumerate(self.layers):
                hidden = layer(hidden, kv_cache[i], meta)
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps, meta.use_kernels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return matmul(hidden, self.lm_head_t).float()

    def rope_cos_sin(self, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables [max_positions, head_dim], computed in fp32 as transformers does."""
        params = getattr(self.config, "rope_parameters", None) or {}
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            base = params.get("rope_theta", getattr(self.config, "rope_theta", 10000.0))
            dim = self.head_dim
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](self.config, None)
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scaling, emb.sin() * scaling
