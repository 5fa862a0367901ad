"""A MoE layer's weights from a checkpoint: the router and every expert's gate/up (fused) and down, in
the per-expert layout checkpoints on the Hub use (Mixtral's `block_sparse_moe.experts.E.w1/w3/w2`,
Qwen3-MoE's `mlp.experts.E.gate_proj/up_proj/down_proj`; quantized experts come through the same
canonical form as any linear) or transformers' fused 3-D tensors (`mlp.experts.gate_up_proj`)."""

from __future__ import annotations

import torch

from llmopt.engine.layers.sparse_moe import SparseMoE
from llmopt.engine.models.checkpoint_weights import CheckpointWeights, set_linear

# (the MoE block's name, gate, up, down) of each checkpoint layout
EXPERT_NAMES = (("block_sparse_moe.", "w1", "w3", "w2"), ("mlp.", "gate_proj", "up_proj", "down_proj"))


def load_moe(moe: SparseMoE, weights: CheckpointWeights, prefix: str) -> None:
    """Fill `moe` from the layer `prefix` ("model.layers.3.")."""
    block = next((b for b, *_ in EXPERT_NAMES if prefix + b + "gate.weight" in weights), None)
    if block is None:
        raise ValueError(f"{prefix}: a mixture-of-experts layer without a router ({prefix}mlp.gate.weight)")
    moe.router_t = weights.linear(prefix + block, "gate")
    fused = prefix + block + "experts.gate_up_proj"
    if fused in weights:
        load_fused_experts(moe, weights, fused, prefix + block + "experts.down_proj")
        return
    _, gate, up, down = next(names for names in EXPERT_NAMES if names[0] == block)
    for e, expert in enumerate(moe.experts):
        experts = f"{prefix}{block}experts.{e}."
        set_linear(expert, "gate_up_weight", weights.linear(experts, gate, up))
        set_linear(expert, "down_weight", weights.linear(experts, down))


def load_fused_experts(moe: SparseMoE, weights: CheckpointWeights, gate_up: str, down: str) -> None:
    """transformers' own layout: gate_up [experts, 2 * intermediate, hidden], down [experts, hidden,
    intermediate], each expert's slice [out, in] like a linear's weight."""
    gate_ups, downs = weights.take(gate_up), weights.take(down)
    assert len(gate_ups) == len(downs) == len(moe.experts), (gate_ups.shape, downs.shape)
    for expert, gu, d in zip(moe.experts, gate_ups, downs):
        expert.gate_up_weight = torch.nn.Parameter(gu.t().contiguous(), requires_grad=False)
        expert.down_weight = torch.nn.Parameter(d.t().contiguous(), requires_grad=False)
