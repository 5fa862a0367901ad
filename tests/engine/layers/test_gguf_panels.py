"""The GGUF kernel (kernels/gguf_matmul.cpp) on every type a Q2_K ... Q8_0 file holds, against the `gguf`
package's own dequantization: the panels hold the file's weights exactly (the kernel on the identity gives
them back to fp32 rounding), a product stays within what int8 activations cost, a fused layer of mixed
types computes each part at its own width, and the panels take the file's bytes (K-quants' 6-bit scales
unpacked to a byte each); one-row calls prefetch where timed steps say it is faster."""

from __future__ import annotations

import time

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from llmopt.engine.formats.gguf import GGUFBlocks
from llmopt.engine.layers import gguf_panels
from llmopt.engine.layers.gguf_panels import GGUFPanels
from llmopt.engine.layers.quantized_linear import QuantizedLinear

pytestmark = pytest.mark.skipif(
    not gguf_panels.supported(), reason="the GGUF kernel needs AVX-512 VNNI (generic panels elsewhere)"
)
RNG = np.random.default_rng(0)
# Where each super-block type keeps its fp16 fields (d, then dmin where it has one).
K_HALVES = {T.Q2_K: (80, 2), T.Q3_K: (108, 1), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, 1)}


def file_blocks(qtype: T, rows: int, cols: int) -> np.ndarray:
    """Blocks of `qtype`: quantized by gguf-py where it can, else random bytes with finite fp16 fields
    (any bit pattern of a K-quant's values and scales is a valid block)."""
    if qtype not in K_HALVES:
        weight = RNG.standard_normal((rows, cols)).astype(np.float32)
        weight[1, :32] = 0.25  # a flat block
        return quantize(weight, qtype)
    blocks = RNG.integers(0, 256, (rows * cols // 256, gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    start, fields = K_HALVES[qtype]
    blocks[:, start : start + 2 * fields] = (
        RNG.uniform(-0.1, 0.1, (len(blocks), fields)).astype(np.float16).view(np.uint8)
    )
    return blocks.reshape(rows, -1)


def reference(data: np.ndarray, qtype: T) -> torch.Tensor:
    return torch.from_numpy(dequantize(data, qtype).reshape(data.shape[0], -1).astype(np.float32))


@pytest.mark.parametrize("qtype", gguf_panels.TYPES, ids=lambda t: t.name)
def test_each_type_keeps_the_files_weights_and_bytes(qtype):
    rows, cols = 48, 512
    data = file_blocks(qtype, rows, cols)
    panels = gguf_panels.pack(GGUFBlocks(data, qtype, cols))
    weight = reference(data, qtype)
    torch.testing.assert_close(panels.dequantize(), weight, rtol=0, atol=4e-7 * float(weight.abs().max()))
    # the file's bytes, with K-quants' 12 bytes of packed scales a super-block unpacked to 16 (and
    # Q2_K / Q3_K's 2- and 3-bit values in nibble words)
    extra = {T.Q4_K: 4, T.Q5_K: 4, T.Q2_K: 16, T.Q3_K: 4}.get(qtype, 0)
    assert (
        panels.data.numel()
        <= data.nbytes * (1 + extra / gguf.GGML_QUANT_SIZES[qtype][1]) + 0.01 * data.nbytes
    )


@pytest.mark.parametrize("qtype", gguf_panels.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 5, 8, 13])
def test_each_type_multiplies_within_what_int8_activations_cost(qtype, rows):
    data = file_blocks(qtype, 32, 512)
    layer = QuantizedLinear(gguf_panels.pack(GGUFBlocks(data, qtype, 512)))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    exact = x.double() @ reference(data, qtype).double().t()
    assert layer.kernel == "gguf"
    error = float((layer(x).double() - exact).norm() / exact.norm())
    assert 0 < error < 0.012, error  # int8 activations: 0.4-0.7 % measured


def test_a_fused_layer_runs_each_part_at_its_own_width():
    """Q4_K_M's q/k/v: Q4_K q and k beside a Q6_K v, each part's panels at its type."""
    parts = [(T.Q4_K, 64), (T.Q4_K, 16), (T.Q6_K, 16)]
    blocks = [GGUFBlocks(file_blocks(t, rows, 256), t, 256) for t, rows in parts]
    fused = GGUFPanels.cat([gguf_panels.pack(b) for b in blocks])
    assert fused.out_features == 96 and set(fused.types) == {"Q4_K", "Q6_K"}
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    separate = torch.cat([gguf_panels.pack(b).matmul(x) for b in blocks], dim=1)
    assert torch.equal(fused.matmul(x), separate)


@pytest.fixture
def prefetch_unchosen(monkeypatch):
    """The process's one-row prefetch choice forgotten for the test, and the kernel's flag put back."""
    before = torch.ops.llmopt.gguf_one_row_prefetch()
    monkeypatch.setattr(gguf_panels, "_one_row_prefetch", None)
    yield
    torch.ops.llmopt.gguf_set_one_row_prefetch(before)


@pytest.mark.parametrize("faster", [True, False], ids=["faster-with", "faster-without"])
def test_one_row_steps_prefetch_where_a_timed_step_is_faster_so(prefetch_unchosen, faster):
    def step():  # a step that takes 3 ms the faster way, 6 the other
        time.sleep(0.003 if torch.ops.llmopt.gguf_one_row_prefetch() == faster else 0.006)

    assert gguf_panels.choose_one_row_prefetch(step) is faster
    assert torch.ops.llmopt.gguf_one_row_prefetch() is faster


def test_one_row_steps_keep_the_default_where_prefetching_is_no_faster(prefetch_unchosen):
    assert gguf_panels.choose_one_row_prefetch(lambda: time.sleep(0.003)) is False
