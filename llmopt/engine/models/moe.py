"""Mixture-of-experts decoders: Mixtral (Llama attention) and Qwen3-MoE (Qwen3 attention, q/k norm).
Attention is llama.py's; the MLP after it is a sparse MoE (layers/sparse_moe.py), or, in Qwen3-MoE layers that
its config keeps dense (`mlp_only_layers`, `decoder_sparse_step`), the Llama MLP. The one-call decode
step (decode_layers) runs dense Llama layers only, so these models run layer by layer."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from llmopt.engine.layers.sparse_moe import RouterConfig, SparseMoE
from llmopt.engine.models.llama import DecoderLayer, LlamaForCausalLM

MOE_MODEL_TYPES = ("mixtral", "qwen3_moe")


def router_config(config: PretrainedConfig) -> RouterConfig:
    # Mixtral's router always renormalises; Qwen3-MoE's when norm_topk_prob (transformers' defaults).
    normalize = config.model_type == "mixtral" or bool(getattr(config, "norm_topk_prob", False))
    return RouterConfig(config.num_experts, config.num_experts_per_tok, normalize)


def expert_size(config: PretrainedConfig) -> int:
    """Intermediate size of one expert: Qwen3-MoE has its own for experts; Mixtral's is the MLP's."""
    return getattr(config, "moe_intermediate_size", None) or config.intermediate_size


def is_sparse(config: PretrainedConfig, index: int) -> bool:
    """Whether layer `index` has a mixture of experts, as Qwen3MoeDecoderLayer decides (Mixtral: all)."""
    if index in (getattr(config, "mlp_only_layers", None) or []):
        return False
    return config.num_experts > 0 and (index + 1) % getattr(config, "decoder_sparse_step", 1) == 0


class MoeDecoderLayer(DecoderLayer):
    """Llama/Qwen3 attention followed by a sparse MoE in place of the dense MLP."""

    def __init__(self, config: PretrainedConfig, head_dim: int):
        super().__init__(config, head_dim)
        del self.gate_up_weight, self.down_weight  # the experts hold the MLP weights
        self.moe = SparseMoE(config.hidden_size, expert_size(config), router_config(config))

    def feed_forward(self, x: torch.Tensor, use_kernels: bool) -> torch.Tensor:
        return self.moe(x, use_kernels)


class MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        assert config.model_type in MOE_MODEL_TYPES, config.model_type
        super().__init__(config)
        self.fused_decode = False

    def make_layer(self, config: PretrainedConfig, index: int) -> DecoderLayer:
        if is_sparse(config, index):
            return MoeDecoderLayer(config, self.head_dim)
        return DecoderLayer(config, self.head_dim)
