"""The int4 / int8 panel kernel (kernels/quantized_matmul.cpp, layout in layers/quantized_panels.py):
integer part bit-exact against PyTorch, float result against x @ W_dequantized^T, and whole quantized
checkpoints against their dequantized selves along a greedy continuation."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine import kernels
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers import quantized_panels
from llmopt.engine.layers.quantized_linear import DEQUANTIZE_FROM_ROWS, QuantizedLinear

pytestmark = pytest.mark.skipif(not kernels.load(), reason="no C++ compiler: the engine runs PyTorch ops")
# logits: the widest reference gap at which the kernels' int8 activations may pick the other token (on the
# session's GPTQ / AWQ / INT8 copies the widest measured was 0.32, at 88 / 94 / 88 of 96 tokens agreeing)
NEAR_TIE = 0.5
# (bits, group size, in_features): 4-bit groups of 16/32/64/128, 8-bit grouped and per channel (group =
# in), 6-bit (Q6_K) and 8-bit in groups of 16
CASES = [(4, 16, 128), (4, 32, 256), (4, 64, 256), (4, 128, 256), (6, 16, 256), (8, 16, 128), (8, 32, 128)]
CASES += [(8, 128, 128), (8, 256, 256)]
ROWS = [1, 3, 16, 127]


def random_weight(bits: int, group: int, in_features: int, out_features: int = 48, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    groups = in_features // group
    return QuantizedWeight(
        q=torch.randint(0, 2**bits, (out_features, in_features), generator=gen).to(torch.uint8),
        scale=torch.rand(out_features, groups, generator=gen) * 0.01 + 0.001,
        zero=torch.randint(0, 2**bits, (out_features, groups), generator=gen).float(),
        bits=bits,
        group_size=group,
    )


def activation_block(group: int) -> int:
    return 16 if group == 16 else 32


def quantize_reference(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row and block of 32 (16 for groups of 16): d = max|x| / 127, a = round(x / d) (half to even),
    and the zero-point sums xs[m, g] = sum over the group's blocks of d * sum(a)."""
    rows, k = x.shape
    block = activation_block(group)
    blocks = x.view(rows, k // block, block)
    d = blocks.abs().amax(-1) / 127
    safe = torch.where(d == 0, torch.ones_like(d), d)
    a = torch.where(d[..., None] == 0, 0.0, torch.round(blocks / safe[..., None]))
    sums = (d * a.sum(-1)).view(rows, k // group, group // block).sum(-1)
    return a.to(torch.int8).view(rows, k), d, sums


def run(x: torch.Tensor, panels: quantized_panels.QuantizedPanels) -> torch.Tensor:
    return torch.ops.llmopt.quantized_matmul(x, panels.packed, panels.scales)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group", [16, 32, 64, 128, 256])
def test_activations_quantize_like_the_reference(rows, group):
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, :32] = 0  # an all-zero block: scale 0, values 0
    q, d, sums = torch.ops.llmopt.quantize_activations(x, group)
    ref_q, ref_d, ref_sums = quantize_reference(x, group)
    assert torch.equal(q, ref_q) and torch.equal(d, ref_d)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("bits", "group", "in_features"), CASES)
def test_integer_dot_products_are_bit_exact(bits, group, in_features, rows):
    """Integer activations with a block maximum of 127 quantize to themselves (d = 1), and power-of-two
    scales with integer zero points make every fp32 step exact: the kernel must equal the int64 product."""
    gen = torch.Generator().manual_seed(rows)
    w = random_weight(bits, group, in_features)
    w.scale = 2.0 ** torch.randint(-2, 1, w.scale.shape, generator=gen).float()
    a = torch.randint(-127, 128, (rows, in_features), generator=gen)
    a.view(rows, -1, activation_block(group))[:, :, 0] = (
        127  # every block's max |a| is 127: d = 1, a unchanged
    )
    centered = (w.q.long() - w.zero.long().repeat_interleave(group, 1)).view(-1, in_features // group, group)
    per_group = torch.einsum("ngk,mgk->mng", centered, a.view(rows, -1, group))  # int64, exact
    expected = (per_group.double() * w.scale.double()[None]).sum(-1)
    got = run(a.float(), quantized_panels.pack(w))
    assert torch.equal(got.double(), expected)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("bits", "group", "in_features"), CASES)
def test_float_result_matches_the_dequantized_weight(bits, group, in_features, rows):
    w = random_weight(bits, group, in_features, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    panels = quantized_panels.pack(w)
    torch.testing.assert_close(panels.dequantize(), w.dequantize())
    got = run(x, panels)
    # The same product from the reference's int8 activations, in float64: only summation order differs.
    a, d, _ = quantize_reference(x, group)
    block = activation_block(group)
    x_quantized = (a.double().view(rows, -1, block) * d.double()[..., None]).view(rows, in_features)
    torch.testing.assert_close(got.double(), x_quantized @ w.dequantize().double().t(), rtol=1e-4, atol=1e-4)
    exact = x @ w.dequantize().t()
    assert (got - exact).norm() / exact.norm() < 0.02  # what int8 activations cost


def test_layers_pick_the_panel_kernel_unless_told_otherwise(monkeypatch):
    w = random_weight(4, 32, 128, out_features=64)
    assert QuantizedLinear(w).kernel == "w4a8"
    assert QuantizedLinear(random_weight(8, 128, 128)).kernel == "w8a8"
    assert QuantizedLinear(w, kernel="aten").kernel == "int4"
    assert QuantizedLinear(random_weight(6, 16, 128)).kernel == "w8a8"  # Q6_K: 6 bits stored as int8
    assert QuantizedLinear(random_weight(4, 8, 128)).kernel == "dense"  # groups under 16 inputs
    monkeypatch.setenv("LLMOPT_QUANT_KERNEL", "dense")
    assert QuantizedLinear(w).kernel == "dense"
    monkeypatch.setenv("LLMOPT_QUANT_KERNEL", "vnni")
    with pytest.raises(ValueError, match="LLMOPT_QUANT_KERNEL='vnni': expected one of auto, aten, dense"):
        QuantizedLinear(w)


@pytest.mark.model
@pytest.mark.parametrize("method", ["gptq", "awq", "int8"])
def test_quantized_checkpoints_agree_with_their_dequantized_reference(method, request, monkeypatch):
    """Greedy decoding with the panel kernels (decode_layers included) on the session's quantized copies
    of the default model, teacher-forced through the same checkpoint run dequantized in fp32: the kernels
    round activations to int8 (as llama.cpp's Q8_0 activations do), so a pick may differ from the
    reference's, but only where the reference itself nearly ties the two tokens."""
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams
    from llmopt.evaluate.perplexity import engine_scorer

    path = request.getfixturevalue(f"{method}_dir")
    llm = LLM(str(path), num_kv_blocks=32, block_size=16)
    model = llm.engine.runner.model
    assert {model.layers[0].qkv_weight.kernel, model.layers[0].down_weight.kernel} <= {"w4a8", "w8a8"}
    assert model.decode_weights, "decode steps should run in decode_layers"
    prompts = [llm.tokenizer.encode(p) for p in ("The history of the city begins", "def fibonacci(n):")]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))
    monkeypatch.setenv("LLMOPT_QUANT_KERNEL", "dense")
    reference = engine_scorer(path, 128)
    agree = total = 0
    margins = []  # at each disagreement: the reference's logit of its own pick over that of the kernel's
    for prompt, out in zip(prompts, outputs):
        logits = reference(prompt + out.token_ids)[len(prompt) - 1 : -1]
        picked = torch.tensor(out.token_ids)
        predicted = logits.argmax(-1)
        agree += int((predicted == picked).sum())
        total += len(out.token_ids)
        rows = torch.arange(len(picked))
        margins += (logits[rows, predicted] - logits[rows, picked])[predicted != picked].tolist()
    assert agree >= 0.85 * total, f"{agree} of {total} positions agree"
    assert all(m < NEAR_TIE for m in margins), f"disagreements beyond a near-tie: {sorted(margins)}"


def test_panel_layers_run_every_batch_size_in_the_kernel_row_by_row():
    """Prefill-sized batches run the kernel too (no dequantized fp32 path), and a row's result is the
    same whatever other rows share its call: what one request computes does not depend on another's."""
    w = random_weight(4, 64, 256, out_features=64)
    layer = QuantizedLinear(w)
    assert layer.kernel == "w4a8"
    torch.testing.assert_close(layer.dequantized_t(), w.dequantize().t())
    x = torch.randn(DEQUANTIZE_FROM_ROWS + 70, 256)
    expected = x @ w.dequantize().t()
    together = layer(x)
    assert (together - expected).norm() / expected.norm() < 0.02
    alone = torch.cat([layer(x[i : i + 1]) for i in range(0, len(x), 37)])
    assert torch.equal(together[::37], alone)
    assert layer.kernel_weights()[1].dtype == torch.float32  # what routes decode_layers to this kernel
