"""Gemma 3 text decoder over the paged KV cache.

What differs from Llama: RMSNorm scales by (1 + weight) (the loader adds the 1 once, so the same norm
kernel runs), four norms a layer (after attention and after the MLP too), GeGLU with tanh-gelu, the
embedding scaled by sqrt(hidden), q/k norm, attention scaled by query_pre_attn_scalar, tied output,
optional final logit soft-capping, and interleaved layers: sliding-window ("local") layers attend to
the last `sliding_window` positions with their own rotary base, global layers to the whole context.

Every layer keeps all of a sequence's blocks (one cache shared by all layers); a local layer only reads
its window, through the prefill and decode kernels' window argument (a narrower mask where SDPA runs).
A step of decode rows only runs every layer in one compiled call (decode_gemma3_layers in
kernels/cpu_kernels.cpp: the same kernels in the same order, without Python between them).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from llmopt.engine.layers.attention import AttentionMetadata, paged_attention, rope_and_cache, windowed
from llmopt.engine.layers.embedding import embed_tokens
from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.norm import rms_norm
from llmopt.engine.models.llama import one_call_decode

MODEL_TYPES = ("gemma3_text",)
LOCAL = "sliding_attention"


class Gemma3Layer(torch.nn.Module):
    def __init__(self, config: PretrainedConfig, layer_type: str):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.local = layer_type == LOCAL
        self.window = config.sliding_window if self.local else 0
        self.scale = config.query_pre_attn_scalar**-0.5
        q_size, kv_size, hidden = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            config.hidden_size,
        )

        def param(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape), requires_grad=False)

        self.qkv_weight = param(hidden, q_size + 2 * kv_size)  # linears stored [in, out]
        self.o_weight = param(q_size, hidden)
        self.gate_up_weight = param(hidden, 2 * config.intermediate_size)
        self.down_weight = param(config.intermediate_size, hidden)
        # Norm weights hold (1 + w): Gemma's offset, added once at load.
        self.input_norm, self.post_attention_norm = param(hidden), param(hidden)
        self.pre_feedforward_norm, self.post_feedforward_norm = param(hidden), param(hidden)
        self.q_norm, self.k_norm = param(self.head_dim), param(self.head_dim)

    def forward(
        self, hidden: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, rope: tuple
    ) -> torch.Tensor:
        kernels = meta.use_kernels
        x = rms_norm(hidden, self.input_norm, self.eps, kernels)
        attn = self.attention(x, kv_cache, meta, *rope)
        hidden = hidden + rms_norm(attn, self.post_attention_norm, self.eps, kernels)
        x = rms_norm(hidden, self.pre_feedforward_norm, self.eps, kernels)
        gate, up = matmul(x, self.gate_up_weight).chunk(2, dim=-1)
        mlp = matmul(F.gelu(gate, approximate="tanh") * up, self.down_weight)
        return hidden + rms_norm(mlp, self.post_feedforward_norm, self.eps, kernels)

    def attention(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = matmul(x, self.qkv_weight)
        qk = qkv[:, : (heads + kv_heads) * dim].view(num_tokens, heads + kv_heads, dim)
        q = rms_norm(qk[:, :heads], self.q_norm, self.eps, meta.use_kernels)
        k = rms_norm(qk[:, heads:], self.k_norm, self.eps, meta.use_kernels)
        v = qkv[:, (heads + kv_heads) * dim :].view(num_tokens, kv_heads, dim)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        qkv = torch.cat((q.flatten(1), k.flatten(1), v.flatten(1)), 1)  # normed q and k, then v
        q = rope_and_cache(qkv, k_cache, v_cache, meta, heads, kv_heads, dim, rope=(cos, sin))
        out = paged_attention(q.contiguous(), k_cache, v_cache, meta, kv_heads, dim, self.window, self.scale)
        return matmul(out.view(num_tokens, -1), self.o_weight)


class Gemma3ForCausalLM(torch.nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        if getattr(config, "attn_logit_softcapping", None):
            raise NotImplementedError("attention logit soft-capping (Gemma 2) is not supported")
        if getattr(config, "use_bidirectional_attention", False):
            raise NotImplementedError("bidirectional attention (EmbeddingGemma) is not supported")
        self.config = config
        self.head_dim = config.head_dim
        self.num_kv_heads = config.num_key_value_heads
        hidden = config.hidden_size
        self.embed = torch.nn.Parameter(torch.empty(config.vocab_size, hidden), requires_grad=False)
        self.layers = torch.nn.ModuleList(Gemma3Layer(config, t) for t in config.layer_types)
        self.norm = torch.nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.lm_head_t = torch.nn.Parameter(torch.empty(hidden, config.vocab_size), requires_grad=False)
        # Set by kernel_layout.py where every linear has a compiled kernel: what decode_gemma3_layers takes,
        # and the most rows it runs (as Llama's decode_layers).
        self.decode_weights: list[torch.Tensor] | None = None
        self.decode_max_rows = 0

    def forward(
        self, input_ids: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Return the final hidden states [T, hidden] of the flat batch. meta.cos / sin hold the global
        table, then the local one, side by side (see rope_cos_sin)."""
        dim = self.head_dim
        # transformers scales in the weights' dtype: sqrt(hidden) rounded to it, then multiplied.
        hidden = embed_tokens(self.embed, input_ids).to(self.norm.dtype)
        hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)

        def windows_and_scale() -> tuple:  # decode_gemma3_layers' own arguments, built only when it runs
            return [layer.window for layer in self.layers], self.layers[0].scale

        layered = one_call_decode(self, hidden, kv_cache, meta, "decode_gemma3_layers", windows_and_scale)
        if layered is not None:
            return rms_norm(layered, self.norm, self.config.rms_norm_eps, meta.use_kernels)
        ropes = {
            False: (meta.cos[..., :dim].contiguous(), meta.sin[..., :dim].contiguous()),
            True: (meta.cos[..., dim:].contiguous(), meta.sin[..., dim:].contiguous()),
        }
        window = self.config.sliding_window
        local_meta = dataclasses.replace(
            meta, decode=windowed(meta.decode, window), prefill=windowed(meta.prefill, window)
        )
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, kv_cache[i], local_meta if layer.local else meta, ropes[layer.local])
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps, meta.use_kernels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = matmul(hidden, self.lm_head_t).float()
        cap = getattr(self.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def rope_cos_sin(self, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [max_positions, 2 * head_dim]: the global layers' table, then the local layers'
        (each with its own base), so the runner indexes both by position in one step."""
        tables = [rope_table(self.config, t, max_positions) for t in ("full_attention", LOCAL)]
        return torch.cat([c for c, _ in tables], -1), torch.cat([s for _, s in tables], -1)


def rope_table(
    config: PretrainedConfig, layer_type: str, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    params = config.rope_parameters[layer_type]
    if params.get("rope_type", "default") == "default":
        dim = config.head_dim
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scaling = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, layer_type=layer_type)
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling
