"""Sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE): a linear router picks each token's top-k experts,
and the step's token-expert pairs are grouped by expert so that every chosen expert runs once, on all
its rows at once (its weights read once per step, not once per token)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmopt.engine.layers.linear import matmul
from llmopt.engine.layers.mlp import gated_mlp
from llmopt.engine.layers.quantized_linear import QuantizedLinear


@dataclass(frozen=True)
class RouterConfig:
    num_experts: int
    top_k: int
    # Mixtral always renormalises the top-k probabilities to sum to 1; Qwen3-MoE does so only when its
    # config sets norm_topk_prob (otherwise the weights are the full softmax's, summing to under 1).
    normalize_top_k: bool

    def __post_init__(self) -> None:
        assert 1 <= self.top_k <= self.num_experts, (self.top_k, self.num_experts)


class Expert(torch.nn.Module):
    """One expert's gated MLP; its linears dense ([in, out] or packed panels) or QuantizedLinear."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_weight: torch.nn.Parameter | QuantizedLinear = torch.nn.Parameter(
            torch.empty(hidden, 2 * intermediate), requires_grad=False
        )
        self.down_weight: torch.nn.Parameter | QuantizedLinear = torch.nn.Parameter(
            torch.empty(intermediate, hidden), requires_grad=False
        )

    def forward(self, x: torch.Tensor, use_kernels: bool) -> torch.Tensor:
        return gated_mlp(x, self.gate_up_weight, self.down_weight, use_kernels)


def route(logits: torch.Tensor, router: RouterConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts), both [T, top_k]: softmax over all experts in fp32, then the top k, as
    transformers' MixtralTopKRouter and Qwen3MoeTopKRouter do."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, router.top_k, dim=-1)
    if router.normalize_top_k:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


class SparseMoE(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int, router: RouterConfig):
        super().__init__()
        self.router = router
        self.router_t = torch.nn.Parameter(  # [hidden, experts], transposed like every linear
            torch.empty(hidden, router.num_experts), requires_grad=False
        )
        self.experts = torch.nn.ModuleList(Expert(hidden, intermediate) for _ in range(router.num_experts))

    def forward(self, x: torch.Tensor, use_kernels: bool) -> torch.Tensor:
        weights, experts = route(matmul(x, self.router_t), self.router)
        flat = experts.flatten()  # pair p = (token p // top_k, its (p % top_k)-th expert)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order within one
        rows = order // self.router.top_k
        counts = torch.bincount(flat, minlength=self.router.num_experts).tolist()
        gathered = x[rows]
        out_rows = torch.empty_like(gathered)
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:  # an expert no token chose is not read at all
                out_rows[start : start + count] = expert(gathered[start : start + count], use_kernels)
                start += count
        out_rows.mul_(weights.flatten()[order, None].to(x.dtype))
        # Each token's k contributions, added in expert order (as transformers' loop over experts adds).
        return torch.zeros_like(x).index_add_(0, rows, out_rows)
