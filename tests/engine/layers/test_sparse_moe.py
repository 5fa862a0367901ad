"""The sparse MoE layer against a naive per-token loop (each token through each of its experts, one at a
time), routed as Mixtral and as Qwen3-MoE, dense and with experts in the canonical quantized form."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine import kernels
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers.linear import pack_panels
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.layers.sparse_moe import RouterConfig, SparseMoE
from llmopt.engine.models.checkpoint_weights import set_linear

HIDDEN, INTERMEDIATE, EXPERTS = 64, 64, 8


def random_moe(router: RouterConfig, seed: int = 0) -> tuple[SparseMoE, list[torch.Tensor]]:
    """A SparseMoE with random dense experts, and each expert's (gate, up, down) as [out, in] weights."""
    gen = torch.Generator().manual_seed(seed)
    moe = SparseMoE(HIDDEN, INTERMEDIATE, router)
    # Router logits of a few units: the top k hold part of the probability, so renormalising matters.
    router_t = torch.randn(HIDDEN, EXPERTS, generator=gen) * 0.3
    moe.router_t = torch.nn.Parameter(router_t, requires_grad=False)
    reference = []
    for expert in moe.experts:
        gate, up = (torch.randn(INTERMEDIATE, HIDDEN, generator=gen) * 0.2 for _ in range(2))
        down = torch.randn(HIDDEN, INTERMEDIATE, generator=gen) * 0.2
        expert.gate_up_weight = torch.nn.Parameter(
            torch.cat((gate, up)).t().contiguous(), requires_grad=False
        )
        expert.down_weight = torch.nn.Parameter(down.t().contiguous(), requires_grad=False)
        reference.append((gate, up, down))
    return moe, reference


def naive_moe(x: torch.Tensor, router_t: torch.Tensor, experts: list, router: RouterConfig) -> torch.Tensor:
    """Token by token: softmax over the router's logits, the top k, renormalised if the config says so."""
    out = torch.zeros_like(x)
    for t in range(len(x)):
        probs = torch.softmax(x[t] @ router_t, dim=-1)
        chosen = probs.argsort(descending=True)[: router.top_k]
        weights = probs[chosen] / (probs[chosen].sum() if router.normalize_top_k else 1)
        for e, w in zip(chosen.tolist(), weights):
            gate, up, down = experts[e]
            out[t] += w * (down @ (torch.nn.functional.silu(gate @ x[t]) * (up @ x[t])))
    return out


ROUTERS = {
    "mixtral-top2": RouterConfig(EXPERTS, 2, normalize_top_k=True),
    "qwen3-top2-unnormalized": RouterConfig(EXPERTS, 2, normalize_top_k=False),
    "qwen3-top3": RouterConfig(EXPERTS, 3, normalize_top_k=True),
}


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_grouped_experts_equal_a_per_token_loop(name, rows):
    router = ROUTERS[name]
    moe, reference = random_moe(router)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(1))
    expected = naive_moe(x, moe.router_t, reference, router)
    torch.testing.assert_close(moe(x, use_kernels=False), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not kernels.load(), reason="the compiled kernels are not available")
def test_packed_experts_with_the_compiled_kernels():
    router = ROUTERS["mixtral-top2"]
    moe, reference = random_moe(router)
    for expert in moe.experts:  # as models/kernel_layout.py lays them out
        expert.gate_up_weight = torch.nn.Parameter(pack_panels(expert.gate_up_weight), requires_grad=False)
        expert.down_weight = torch.nn.Parameter(pack_panels(expert.down_weight), requires_grad=False)
    x = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(moe(x, use_kernels=True), naive_moe(x, moe.router_t, reference, router))


def quantize(weight: torch.Tensor, bits: int, group_size: int) -> QuantizedWeight:
    """Round [out, in] to the canonical form (asymmetric for int4, symmetric per channel for int8)."""
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // group_size, group_size)
    if bits == 8:
        scale = groups.abs().amax(-1) / 127
        zero = torch.full_like(scale, 128.0)
    else:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = (high - low) / (2**bits - 1)
        zero = (-low / scale).round()
    q = (groups / scale[..., None] + zero[..., None]).round().clamp(0, 2**bits - 1)
    return QuantizedWeight(q.view(out_features, in_features).to(torch.uint8), scale, zero, bits, group_size)


@pytest.mark.parametrize(("bits", "group_size"), [(8, HIDDEN), (4, 32)])
def test_quantized_experts_equal_their_dequantized_reference(bits, group_size):
    """Experts through QuantizedLinear (whichever weight-only kernel it picks here) against the same
    integers dequantized to fp32 and run densely, token by token."""
    router = ROUTERS["mixtral-top2"]
    moe, reference = random_moe(router)
    dequantized = []
    for expert, (gate, up, down) in zip(moe.experts, reference):
        gate_up_q, down_q = (
            quantize(torch.cat((gate, up)), bits, group_size),
            quantize(down, bits, group_size),
        )
        set_linear(expert, "gate_up_weight", QuantizedLinear(gate_up_q))
        set_linear(expert, "down_weight", QuantizedLinear(down_q))
        gate_up = gate_up_q.dequantize()
        dequantized.append((gate_up[:INTERMEDIATE], gate_up[INTERMEDIATE:], down_q.dequantize()))
    assert "dense" not in {e.gate_up_weight.kernel for e in moe.experts}, "a weight-only kernel runs them"
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(1))
    expected = naive_moe(x, moe.router_t, dequantized, router)
    got = moe(x, use_kernels=False)
    # The kernels round activations (to int8 or bf16): agreement to that precision, not fp32's. A routing
    # error (a wrong expert, unnormalised weights) is off by tens of percent.
    error = (got - expected).norm() / expected.norm()
    assert error < 3e-2, f"relative error {error:.4f}"
