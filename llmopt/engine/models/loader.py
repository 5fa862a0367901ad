"""The engine's model from a checkpoint's weights (checkpoint_weights.py): q/k/v and gate/up fused,
linears stored [in, out], the output layer as `lm_head_dtype` asks, every tensor used."""

from __future__ import annotations

from pathlib import Path

import torch

from llmopt.engine.layers.embedding import QuantizedEmbedding
from llmopt.engine.layers.lm_head import output_layer
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.models.checkpoint_weights import CheckpointWeights, set_linear
from llmopt.engine.models.gemma3 import MODEL_TYPES as GEMMA3_TYPES
from llmopt.engine.models.gemma3 import Gemma3ForCausalLM, Gemma3Layer
from llmopt.engine.models.llama import DecoderLayer, LlamaForCausalLM
from llmopt.engine.models.model_config import read_model_config
from llmopt.engine.models.moe import MOE_MODEL_TYPES, MoeDecoderLayer, MoeForCausalLM
from llmopt.engine.models.moe_loader import load_moe


def load_layer(layer: DecoderLayer, weights: CheckpointWeights, prefix: str) -> None:
    attn = prefix + "self_attn."
    set_linear(layer, "qkv_weight", weights.linear(attn, "q_proj", "k_proj", "v_proj"))
    if attn + "q_proj.bias" in weights:
        layer.qkv_bias = weights.param(attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias")
    set_linear(layer, "o_weight", weights.linear(attn, "o_proj"))
    if isinstance(layer, MoeDecoderLayer):
        load_moe(layer.moe, weights, prefix)
    else:
        set_linear(layer, "gate_up_weight", weights.linear(prefix + "mlp.", "gate_proj", "up_proj"))
        set_linear(layer, "down_weight", weights.linear(prefix + "mlp.", "down_proj"))
    layer.input_norm = weights.param(prefix + "input_layernorm.weight")
    layer.post_attention_norm = weights.param(prefix + "post_attention_layernorm.weight")
    if attn + "q_norm.weight" in weights:
        layer.q_norm = weights.param(attn + "q_norm.weight")
        layer.k_norm = weights.param(attn + "k_norm.weight")


def load_model(
    checkpoint: Path,
    dtype: torch.dtype,
    native_gguf: bool = True,
    lm_head_dtype: str = "auto",
    q4_0: bool = False,
) -> LlamaForCausalLM:
    """The model of `checkpoint` (a folder, or a GGUF file read at its own precision when `native_gguf`,
    else dequantized to `dtype` tensor by tensor; `q4_0`: its linears on a finer grid than Q4_0
    requantized to it, as a draft model runs)."""
    config = read_model_config(checkpoint)
    weights = CheckpointWeights(checkpoint, dtype, native_gguf, q4_0)
    if config.model_type in GEMMA3_TYPES:
        return load_gemma3(config, weights, lm_head_dtype)
    with torch.device("meta"):
        model = MoeForCausalLM(config) if config.model_type in MOE_MODEL_TYPES else LlamaForCausalLM(config)
    set_linear(model, "embed", weights.embedding("model.embed_tokens.weight"))
    model.norm = weights.param("model.norm.weight")
    set_linear(model, "lm_head_t", output_head(model, config, weights, lm_head_dtype))
    for i, layer in enumerate(model.layers):
        load_layer(layer, weights, f"model.layers.{i}.")
    quantized = any(isinstance(m, QuantizedLinear) for m in model.modules())
    set_linear(model, "lm_head_t", output_layer(model.lm_head_t, lm_head_dtype, quantized))
    weights.drop_activation_scales()
    weights.assert_all_used()
    return model.eval()


def output_head(model, config, weights: CheckpointWeights, lm_head_dtype: str):
    """The output layer [hidden, vocab]: the checkpoint's own, or the embedding's transpose when tied (a
    GGUF's quantized embedding blocks as they are, unless an fp32 head is asked for)."""
    tied = getattr(config, "tie_word_embeddings", False)
    if "lm_head.weight" in weights and not tied:
        return weights.linear("", "lm_head")
    weights.discard("lm_head.weight")
    if lm_head_dtype != "float32" and (head := weights.tied_head()) is not None:
        return head
    table = model.embed.dense() if isinstance(model.embed, QuantizedEmbedding) else model.embed
    return torch.nn.Parameter(table.t().contiguous().to(weights.dtype), requires_grad=False)


def gemma_norm(weights: CheckpointWeights, name: str) -> torch.nn.Parameter:
    """Gemma's RMSNorm scales by (1 + weight): stored with the 1 added, so the plain norm kernel runs."""
    return torch.nn.Parameter((1.0 + weights.take(name).float()).to(weights.dtype), requires_grad=False)


def load_gemma3_layer(layer: Gemma3Layer, weights: CheckpointWeights, prefix: str) -> None:
    attn = prefix + "self_attn."
    set_linear(layer, "qkv_weight", weights.linear(attn, "q_proj", "k_proj", "v_proj"))
    set_linear(layer, "o_weight", weights.linear(attn, "o_proj"))
    set_linear(layer, "gate_up_weight", weights.linear(prefix + "mlp.", "gate_proj", "up_proj"))
    set_linear(layer, "down_weight", weights.linear(prefix + "mlp.", "down_proj"))
    for attr, name in (
        ("input_norm", "input_layernorm"),
        ("post_attention_norm", "post_attention_layernorm"),
        ("pre_feedforward_norm", "pre_feedforward_layernorm"),
        ("post_feedforward_norm", "post_feedforward_layernorm"),
        ("q_norm", "self_attn.q_norm"),
        ("k_norm", "self_attn.k_norm"),
    ):
        setattr(layer, attr, gemma_norm(weights, f"{prefix}{name}.weight"))


def load_gemma3(config, weights: CheckpointWeights, lm_head_dtype: str) -> Gemma3ForCausalLM:
    with torch.device("meta"):
        model = Gemma3ForCausalLM(config)
    set_linear(model, "embed", weights.embedding("model.embed_tokens.weight"))
    model.norm = gemma_norm(weights, "model.norm.weight")
    for i, layer in enumerate(model.layers):
        load_gemma3_layer(layer, weights, f"model.layers.{i}.")
    set_linear(model, "lm_head_t", output_head(model, config, weights, lm_head_dtype))
    quantized = any(isinstance(m, QuantizedLinear) for m in model.modules())
    set_linear(model, "lm_head_t", output_layer(model.lm_head_t, lm_head_dtype, quantized))
    weights.drop_activation_scales()
    weights.assert_all_used()
    return model.eval()
