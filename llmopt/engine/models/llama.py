"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a paged KV cache.

One batched forward per engine step: the tokens of every scheduled sequence are concatenated into one
flat batch for the linear layers; attention runs in at most two groups (query rows that each attend to
their own context: decodes, speculative verifications and short chunks; and padded prefill chunks),
reading keys and values from the paged cache through block tables.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoConfig, PretrainedConfig

from llmopt.engine.layers.quantized_linear import (
    DEQUANTIZE_FROM_ROWS,
    QuantizedLinear,
    QuantizedWeight,
    checkpoint_quantization,
    take_quantized,
)

log = logging.getLogger(__name__)
PANEL = 32  # output columns per panel of a packed dense weight (kPanel in cpu_kernels.cpp)
LINEARS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight", "lm_head_t")
NO_SCALES = torch.empty(0)  # the scales slot of a dense weight in decode_layers


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


def matmul(
    x: torch.Tensor, weight_t: torch.Tensor | QuantizedLinear, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if isinstance(weight_t, QuantizedLinear):
        return weight_t(x, bias)
    if weight_t.dim() == 3:  # packed in panels for the compiled kernel (see pack_panels)
        out = torch.ops.llmopt.packed_linear(x, weight_t, weight_t.shape[0] * PANEL)
        return out if bias is None else out.add_(bias)
    # Dense weights are stored transposed ([in, out]): MKL's GEMM on that layout is 2-4x faster than
    # F.linear's [out, in] for the skinny batches of decoding (measured at 16 rows on this CPU).
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def pack_panels(weight_t: torch.Tensor) -> torch.Tensor:
    """[in, out] -> [out / 32, in, 32]: each group of 32 output columns contiguous, as packed_linear
    in llmopt/engine/csrc reads them."""
    k, n = weight_t.shape
    assert n % PANEL == 0, f"{n} output features are not a multiple of {PANEL}"
    return weight_t.view(k, n // PANEL, PANEL).permute(1, 0, 2).contiguous()


def layer_linears(layer: DecoderLayer) -> tuple[torch.Tensor | QuantizedLinear, ...]:
    return layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight


def kernel_weights(weight: torch.Tensor | QuantizedLinear) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weight, scales) of a linear as decode_layers takes it; None where it has no compiled kernel."""
    if isinstance(weight, QuantizedLinear):
        return weight.kernel_weights()
    return (weight, NO_SCALES) if weight.dim() == 3 else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, compiled: bool) -> torch.Tensor:
    # F.rms_norm runs six ATen ops on CPU (about 17 us for one row here); the compiled kernel one (5 us).
    if compiled:
        return torch.ops.llmopt.rms_norm(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)


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
        gate_up = matmul(x, self.gate_up_weight)
        if meta.use_kernels:
            act = torch.ops.llmopt.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return hidden.add_(matmul(act, self.down_weight))

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
        if meta.use_kernels:  # rotary embedding and the cache writes in one pass
            q = torch.ops.llmopt.rope_and_cache(
                qkv, meta.cos, meta.sin, k_cache, v_cache, meta.slot_mapping, heads
            )
        else:
            qk = qkv[:, : (heads + kv_heads) * dim].view(num_tokens, heads + kv_heads, dim)
            v = qkv[:, (heads + kv_heads) * dim :].view(num_tokens, kv_heads, dim)
            # Rotary embedding on q and k together: one set of ops for both.
            qk = qk * meta.cos + rotate_half(qk) * meta.sin
            q, k = qk[:, :heads], qk[:, heads:]
            k_cache.view(-1, kv_heads, dim).index_copy_(0, meta.slot_mapping, k)
            v_cache.view(-1, kv_heads, dim).index_copy_(0, meta.slot_mapping, v)

        out = torch.empty_like(q)
        n_dec = meta.num_decode_tokens
        if meta.decode is not None and meta.use_kernels:
            q_dec = q[:n_dec].contiguous()
            out[:n_dec] = torch.ops.llmopt.paged_decode_attention(
                q_dec,
                k_cache,
                v_cache,
                meta.decode.block_tables,
                meta.decode.context_lens,
                self.head_dim**-0.5,
            )
        elif meta.decode is not None:
            out[:n_dec] = self.attend_decode(q[:n_dec], k_cache, v_cache, meta.decode)
        if meta.prefill is not None:
            out[n_dec:] = self.attend_prefill(q[n_dec:], k_cache, v_cache, meta.prefill)
        return matmul(out.view(num_tokens, -1), self.o_weight)

    def gather(self, cache: torch.Tensor, group: AttentionGroup, batch: int) -> torch.Tensor:
        # index_select copies whole blocks at memcpy speed (3x faster than advanced indexing here).
        blocks = torch.index_select(cache, 0, group.block_tables.flatten())
        return blocks.view(batch, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)

    def attend_decode(self, q, k_cache, v_cache, group: AttentionGroup) -> torch.Tensor:
        # One query per sequence: fold the query heads that share a KV head into that head's query
        # rows, which is an ordinary (non-GQA) attention and the fastest SDPA path on CPU.
        batch = q.shape[0]
        group_size = self.num_heads // self.num_kv_heads
        k, v = self.gather(k_cache, group, batch), self.gather(v_cache, group, batch)
        qf = q.view(batch, self.num_kv_heads, group_size, self.head_dim)
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=group.mask)
        return out.reshape(batch, self.num_heads, self.head_dim)

    def attend_prefill(self, q, k_cache, v_cache, group: AttentionGroup) -> torch.Tensor:
        batch, max_q = group.query_index.shape
        k, v = self.gather(k_cache, group, batch), self.gather(v_cache, group, batch)
        qp = q[group.query_index].transpose(1, 2)  # [B, heads, Q, head_dim]
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=group.mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch * max_q, self.num_heads, self.head_dim)[group.valid_index]


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.embed = torch.nn.Parameter(
            torch.empty(config.vocab_size, config.hidden_size), requires_grad=False
        )
        self.layers = torch.nn.ModuleList(
            DecoderLayer(config, self.head_dim) for _ in range(config.num_hidden_layers)
        )
        self.norm = torch.nn.Parameter(torch.empty(config.hidden_size), requires_grad=False)
        self.lm_head_t = torch.nn.Parameter(  # [hidden, vocab], transposed like every linear
            torch.empty(config.hidden_size, config.vocab_size), requires_grad=False
        )
        # Set by pack_linears where every layer's linears have a compiled kernel: what decode_layers takes,
        # and the most rows it runs (quantized layers dequantize for large batches, in Python).
        self.decode_weights: list[torch.Tensor] | None = None
        self.decode_max_rows = 0

    def forward(
        self, input_ids: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Return the final hidden states [T, hidden] of the flat batch."""
        hidden = F.embedding(input_ids, self.embed)
        one_call = meta.use_kernels and meta.prefill is None and len(input_ids) <= self.decode_max_rows
        if self.decode_weights and one_call:
            # Decode rows only: all layers in one compiled call (the same kernels, in the same order).
            hidden = torch.ops.llmopt.decode_layers(
                hidden,
                self.decode_weights,
                self.config.rms_norm_eps,
                kv_cache,
                meta.cos,
                meta.sin,
                meta.slot_mapping,
                meta.decode.block_tables,
                meta.decode.context_lens,
                self.config.num_attention_heads,
            )
        else:
            for i, layer in enumerate(self.layers):
                hidden = layer(hidden, kv_cache[i], meta)
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps, meta.use_kernels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return matmul(hidden, self.lm_head_t).float()

    def pack_linears(self) -> None:
        """Re-lay every dense fp32 linear in panels for the compiled kernel; quantized ones keep theirs."""
        for module in (self, *self.layers):
            for name, param in list(module.named_parameters(recurse=False)):
                if name in LINEARS and param.dim() == 2 and param.shape[1] % PANEL == 0:
                    setattr(module, name, torch.nn.Parameter(pack_panels(param), requires_grad=False))
        linears = [[kernel_weights(w) for w in layer_linears(layer)] for layer in self.layers]
        plain = all(layer.qkv_bias is None and layer.q_norm is None for layer in self.layers)
        if plain and all(w is not None for ws in linears for w in ws):
            quantized = any(
                isinstance(w, QuantizedLinear) for layer in self.layers for w in layer_linears(layer)
            )
            self.decode_max_rows = DEQUANTIZE_FROM_ROWS - 1 if quantized else 2**31
            self.decode_weights = [  # the order decode_layers reads them in, ten a layer
                t
                for layer, (qkv, o, gate_up, down) in zip(self.layers, linears)
                for t in (layer.input_norm, *qkv, *o, layer.post_attention_norm, *gate_up, *down)
            ]

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


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else None
    files = files or [p.name for p in sorted(model_dir.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(model_dir / name))
    return weights


def load_model(model_dir: Path, dtype: torch.dtype) -> LlamaForCausalLM:
    config = AutoConfig.from_pretrained(model_dir)
    weights = read_safetensors(model_dir)
    qconfig = checkpoint_quantization(model_dir)

    def take(name: str) -> torch.Tensor:
        return weights.pop(name).to(dtype)

    def linear(prefix: str, *names: str) -> torch.nn.Parameter | QuantizedLinear:
        """One (fused) linear layer from the checkpoint's layers `prefix + name`, stored [in, out]."""
        quantized = [take_quantized(weights, prefix + n, qconfig) for n in names] if qconfig else []
        if quantized and all(quantized):
            return QuantizedLinear(QuantizedWeight.cat(quantized), prefix + "+".join(names))
        # A dense layer, or (rarely) a fusion of dense and quantized parts: run it dense.
        parts = [
            q.dequantize().to(dtype) if q is not None else take(prefix + n + ".weight")
            for q, n in zip(quantized or [None] * len(names), names)
        ]
        return torch.nn.Parameter(torch.cat(parts).t().contiguous(), requires_grad=False)

    def set_linear(module: torch.nn.Module, attr: str, value: torch.nn.Parameter | QuantizedLinear) -> None:
        if isinstance(value, QuantizedLinear):
            delattr(module, attr)  # a quantized layer replaces the dense parameter declared in __init__
        setattr(module, attr, value)

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.embed = torch.nn.Parameter(take("model.embed_tokens.weight"), requires_grad=False)
    model.norm = torch.nn.Parameter(take("model.norm.weight"), requires_grad=False)
    tied = getattr(config, "tie_word_embeddings", False) or not any(n.startswith("lm_head.") for n in weights)
    if not tied:
        set_linear(model, "lm_head_t", linear("", "lm_head"))
    else:
        weights.pop("lm_head.weight", None)
        model.lm_head_t = torch.nn.Parameter(model.embed.t().contiguous(), requires_grad=False)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."

        def param(*names: str, prefix: str = p) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.cat([take(prefix + n) for n in names]), requires_grad=False)

        set_linear(layer, "qkv_weight", linear(p + "self_attn.", "q_proj", "k_proj", "v_proj"))
        if p + "self_attn.q_proj.bias" in weights:
            attn = "self_attn."
            layer.qkv_bias = param(attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias")
        set_linear(layer, "o_weight", linear(p + "self_attn.", "o_proj"))
        set_linear(layer, "gate_up_weight", linear(p + "mlp.", "gate_proj", "up_proj"))
        set_linear(layer, "down_weight", linear(p + "mlp.", "down_proj"))
        layer.input_norm = param("input_layernorm.weight")
        layer.post_attention_norm = param("post_attention_layernorm.weight")
        if p + "self_attn.q_norm.weight" in weights:
            layer.q_norm = param("self_attn.q_norm.weight")
            layer.k_norm = param("self_attn.k_norm.weight")
    # Static activation scales of W8A8 checkpoints: the CPU kernels quantize weights only.
    activation_scales = [n for n in weights if n.endswith((".input_scale", ".input_zero_point"))]
    for name in activation_scales:
        del weights[name]
    groups = (qconfig or {}).get("config_groups", {}).values()
    if activation_scales or any(group.get("input_activations") for group in groups):
        log.warning(
            "activation quantization is ignored on CPU: weights stay quantized, activations run in bf16"
        )
    leftover = [n for n in weights if "rotary_emb" not in n]
    assert not leftover, f"weights the model does not use: {leftover[:5]}"
    return model.eval()
