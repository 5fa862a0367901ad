"""The compiled CPU kernels against the PyTorch ops they replace (the engine tests cover them end to end)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers.attention import AttentionGroup, attend_decode, rotate_half, windowed
from llmopt.engine.layers.linear import pack_panels
from llmopt.engine.model_runner import MAX_DECODE_QUERIES, ModelRunner

pytestmark = pytest.mark.skipif(not kernels.load(), reason="no C++ compiler: the engine runs PyTorch ops")


# Every path: one pass (<= 8 rows), row groups with a short last one, several 64-row blocks, and weight
# blocks of 192 rows with a shorter last one (in_features not a multiple of 192).
@pytest.mark.parametrize(
    ("rows", "in_features"),
    [(0, 576), (1, 576), (3, 576), (8, 576), (13, 576), (16, 576), (77, 1536), (200, 200)],
)
def test_packed_linear_equals_mm(rows, in_features):
    torch.manual_seed(rows)
    x, weight_t = torch.randn(rows, in_features), torch.randn(in_features, 960)
    out = torch.ops.llmopt.packed_linear(x, pack_panels(weight_t), 960)
    torch.testing.assert_close(out, x @ weight_t, rtol=1e-5, atol=1e-4)


def test_packed_linear_with_a_partial_last_panel():
    x, weight_t = torch.randn(5, 64), torch.randn(64, 50)
    packed = pack_panels(F.pad(weight_t, (0, 14)))  # columns past 50 are zero
    out = torch.ops.llmopt.packed_linear(x, packed, 50)
    assert out.shape == (5, 50)
    torch.testing.assert_close(out, x @ weight_t, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (64, 32), (8, 128)])
def test_paged_decode_attention_matches_sdpa(block_size, head_dim):
    """Contexts that end inside a block, on its edge, and span many blocks placed anywhere in the pool."""
    torch.manual_seed(block_size)
    heads, kv_heads, num_blocks = 9, 3, 64
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    context_lens = torch.tensor([1, block_size - 1, block_size, block_size + 1, 5 * block_size + 3])
    block_tables = torch.randperm(num_blocks)[: 5 * 6].view(5, 6)
    q = torch.randn(5, heads, head_dim)
    out = torch.ops.llmopt.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, head_dim**-0.5, 0
    )
    for row, length in enumerate(context_lens.tolist()):
        keys = k_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)  # [kv_heads, len, dim]
        values = v_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        expected = F.scaled_dot_product_attention(q[row][:, None], keys, values, enable_gqa=True)
        torch.testing.assert_close(out[row], expected[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 600])
def test_long_contexts_split_in_spans_match_sdpa(window):
    """A context of many blocks is cut into spans attended apart and merged (split-K): a long row beside
    a short one, with and without a window that starts mid-span. The spans follow from a row's own
    length, so its result is bit for bit the same alone as beside another row."""
    torch.manual_seed(window)
    block_size, heads, kv_heads, head_dim, num_blocks = 16, 9, 3, 64, 64
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    context_lens = torch.tensor([41 * block_size + 3, 40])
    block_tables = torch.stack([torch.randperm(num_blocks)[:42], torch.randperm(num_blocks)[:42]])
    q, scale = torch.randn(2, heads, head_dim), 0.125
    out = torch.ops.llmopt.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, window
    )
    for row, length in enumerate(context_lens.tolist()):
        keys = k_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        values = v_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        mask = torch.arange(length) > length - 1 - (window or length)
        expected = F.scaled_dot_product_attention(
            q[row][:, None], keys, values, attn_mask=mask, enable_gqa=True, scale=scale
        )[:, 0]
        torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
    alone = torch.ops.llmopt.paged_decode_attention(
        q[:1], k_cache, v_cache, block_tables[:1], context_lens[:1], scale, window
    )
    assert torch.equal(alone[0], out[0])


@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 256), (8, 64)])
@pytest.mark.parametrize("window", [1, 5, 16, 35])
def test_windowed_decode_attention_matches_sdpa_with_a_window_mask(block_size, head_dim, window):
    """Sliding-window layers: the kernel's window argument and the SDPA path's narrowed mask (`windowed`)
    both equal SDPA over the last `window` keys only, windows shorter than, inside, and across blocks."""
    torch.manual_seed(window)
    heads, kv_heads, num_blocks = 4, 1, 64
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    context_lens = torch.tensor([1, block_size - 1, block_size + 1, 5 * block_size + 3])
    block_tables = torch.randperm(num_blocks)[: 4 * 6].view(4, 6)
    q, scale = torch.randn(4, heads, head_dim), 0.1
    out = torch.ops.llmopt.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, window
    )
    causal = (torch.arange(6 * block_size)[None, :] < context_lens[:, None])[:, None, None, :]
    group = windowed(AttentionGroup(block_tables, context_lens, causal, None, None), window)
    fallback = attend_decode(q, k_cache, v_cache, group, kv_heads, scale)
    for row, length in enumerate(context_lens.tolist()):
        keys = k_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        values = v_cache[block_tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        mask = torch.arange(length) > length - 1 - window  # the last `window` positions
        expected = F.scaled_dot_product_attention(
            q[row][:, None], keys, values, attn_mask=mask, enable_gqa=True, scale=scale
        )[:, 0]
        torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fallback[row], expected, rtol=1e-5, atol=1e-5)


def sdpa_prefill(q, k_cache, v_cache, tables, context_lens, query_lens, scale, window):
    """Each row's new queries (the last query_lens of its context) through SDPA, causal and windowed."""
    outs, start = [], 0
    for row, (length, new) in enumerate(zip(context_lens.tolist(), query_lens.tolist())):
        keys = k_cache[tables[row]].flatten(0, 1)[:length].transpose(0, 1)  # [kv_heads, len, dim]
        values = v_cache[tables[row]].flatten(0, 1)[:length].transpose(0, 1)
        query_pos, key_pos = torch.arange(length - new, length)[:, None], torch.arange(length)[None, :]
        mask = (key_pos <= query_pos) & (key_pos > query_pos - (window or length))
        queries = q[start : start + new].transpose(0, 1)  # [heads, new, dim]
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, enable_gqa=True, scale=scale
        )
        outs.append(out.transpose(0, 1))
        start += new
    return torch.cat(outs)


@pytest.mark.parametrize(
    ("block_size", "head_dim", "heads", "kv_heads"),
    [(16, 64, 9, 3), (16, 256, 4, 1), (8, 32, 8, 8), (64, 128, 4, 2)],
)
@pytest.mark.parametrize("window", [0, 5, 37])
def test_paged_prefill_attention_matches_sdpa(block_size, head_dim, heads, kv_heads, window):
    """Prompt chunks over the paged cache: a fresh row, rows behind a cached prefix, a chunk of one query
    and of a few (a short last tile), contexts ending inside and on the edge of a block, with and without a
    sliding window; GQA groups of 3 and 4, and none."""
    torch.manual_seed(block_size + head_dim + window)
    num_blocks = 120
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    context_lens = torch.tensor([40, 300, 17, 1, 4 * block_size, 129])
    query_lens = torch.tensor([40, 45, 3, 1, 18, 100])
    max_blocks = -(-300 // block_size)
    tables = torch.stack([torch.randperm(num_blocks)[:max_blocks] for _ in context_lens])
    q, scale = torch.randn(int(query_lens.sum()), heads, head_dim), head_dim**-0.5
    out = torch.ops.llmopt.paged_prefill_attention(
        q, k_cache, v_cache, tables, context_lens, query_lens, scale, window
    )
    expected = sdpa_prefill(q, k_cache, v_cache, tables, context_lens, query_lens, scale, window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "heads", "kv_heads"), [(256, 4, 1), (64, 9, 3)])
def test_paged_prefill_attention_is_as_accurate_as_sdpa_against_float64(head_dim, heads, kv_heads):
    """600 fresh queries over their causal context: the kernel's mean error against a float64 reference is
    at most SDPA's (fp32) own, at Gemma 3's head size too (dot products summed in runs, not one chain)."""
    torch.manual_seed(head_dim)
    length, block_size = 600, 16
    k_cache, v_cache = 2 * torch.randn(2, 40, block_size, kv_heads, head_dim)
    tables = torch.randperm(40)[None, : -(-length // block_size)]
    q, scale = 2 * torch.randn(length, heads, head_dim), head_dim**-0.5
    lens = torch.tensor([length])
    out = torch.ops.llmopt.paged_prefill_attention(q, k_cache, v_cache, tables, lens, lens, scale, 0)
    keys = k_cache[tables[0]].flatten(0, 1)[:length].transpose(0, 1)
    values = v_cache[tables[0]].flatten(0, 1)[:length].transpose(0, 1)

    def sdpa(dtype: torch.dtype) -> torch.Tensor:
        args = (q.transpose(0, 1).to(dtype), keys.to(dtype), values.to(dtype))
        return F.scaled_dot_product_attention(*args, is_causal=True, enable_gqa=True, scale=scale).transpose(
            0, 1
        )

    reference = sdpa(torch.float64)
    kernel_error = (out.double() - reference).abs().mean()
    sdpa_error = (sdpa(torch.float32).double() - reference).abs().mean()
    assert kernel_error <= 1.1 * sdpa_error, (float(kernel_error), float(sdpa_error))


def test_a_prefill_rows_result_is_the_same_alone_as_beside_other_rows():
    """The work is cut by each row's own queries, never by the batch: bit for bit the same result."""
    torch.manual_seed(1)
    k_cache, v_cache = torch.randn(2, 64, 16, 3, 64)
    tables = torch.randperm(64)[:60].view(2, 30)
    context_lens, query_lens = torch.tensor([400, 66]), torch.tensor([66, 66])
    q = torch.randn(132, 9, 64)
    both = torch.ops.llmopt.paged_prefill_attention(
        q, k_cache, v_cache, tables, context_lens, query_lens, 0.125, 0
    )
    alone = torch.ops.llmopt.paged_prefill_attention(
        q[:66], k_cache, v_cache, tables[:1], context_lens[:1], query_lens[:1], 0.125, 0
    )
    assert torch.equal(both[:66], alone)


def test_paged_prefill_attention_refuses_inconsistent_lengths():
    k_cache, v_cache = torch.randn(2, 4, 16, 3, 64)
    tables = torch.arange(4).view(1, 4)
    with pytest.raises(RuntimeError, match="add up"):
        torch.ops.llmopt.paged_prefill_attention(
            torch.randn(5, 9, 64), k_cache, v_cache, tables, torch.tensor([10]), torch.tensor([4]), 0.125, 0
        )
    with pytest.raises(RuntimeError, match="beyond the block tables"):
        torch.ops.llmopt.paged_prefill_attention(
            torch.randn(5, 9, 64), k_cache, v_cache, tables, torch.tensor([65]), torch.tensor([5]), 0.125, 0
        )


def test_silu_mul_matches_torch_over_the_whole_range():
    gate = torch.linspace(-120, 120, 100_000)
    up = torch.randn(100_000)
    out = torch.ops.llmopt.silu_mul(torch.cat((gate, up))[None])
    torch.testing.assert_close(out[0], F.silu(gate) * up, rtol=1e-6, atol=1e-30)


def test_rope_and_cache_matches_the_pytorch_path():
    tokens, heads, kv_heads, dim, block = 5, 9, 3, 64, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim)
    cos, sin = torch.randn(tokens, dim), torch.randn(tokens, dim)
    slots = torch.tensor([3, 17, 18, 40, 2])
    k_cache, v_cache = torch.zeros(2, 4, block, kv_heads, dim)
    q = torch.ops.llmopt.rope_and_cache(qkv, cos, sin, k_cache, v_cache, slots, heads)

    qk = qkv[:, : (heads + kv_heads) * dim].view(tokens, heads + kv_heads, dim)
    qk = qk * cos[:, None] + rotate_half(qk) * sin[:, None]
    torch.testing.assert_close(q, qk[:, :heads])
    torch.testing.assert_close(k_cache.view(-1, kv_heads, dim)[slots], qk[:, heads:])
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    assert torch.equal(v_cache.view(-1, kv_heads, dim)[slots], v)
    untouched = torch.ones(4 * block, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache.view(-1, kv_heads, dim)[untouched].any()


@pytest.mark.parametrize("checkpoint", ["model_dir", "int8_dir", "gptq_dir"])
def test_decode_layers_equal_the_per_layer_path(checkpoint, request):
    """The one-call path for decode rows runs the same kernels in the same order: identical logits, for
    fp32 weights and for int8 / int4 ones."""
    folder = request.getfixturevalue(checkpoint)
    runner = ModelRunner(EngineConfig(str(folder), num_kv_blocks=4), folder, max_model_len=64)
    model = runner.model
    assert model.decode_weights, "every layer has a compiled kernel: the one-call path is taken"
    token_ids = list(range(100, 100 + MAX_DECODE_QUERIES))  # short enough to be decode rows
    one_call = runner.prompt_logits(token_ids)
    weights, model.decode_weights = model.decode_weights, None
    per_layer = runner.prompt_logits(token_ids)
    model.decode_weights = weights
    assert torch.equal(one_call, per_layer)


def test_kernels_refuse_bad_shapes():
    with pytest.raises(RuntimeError, match="gate then up"):
        torch.ops.llmopt.silu_mul(torch.randn(3, 7))
    with pytest.raises(RuntimeError, match="shapes"):
        torch.ops.llmopt.packed_linear(torch.randn(2, 63), pack_panels(torch.randn(64, 32)), 32)


def test_building_the_kernels_leaves_path_as_it_was():
    before = os.environ["PATH"]
    kernels.build()
    assert os.environ["PATH"] == before


@pytest.mark.parametrize("required", [False, True])
@pytest.mark.slow
def test_a_failed_build_is_an_error_only_when_kernels_are_required(tmp_path, required):
    # A compiler that always fails, and an empty build cache, so the build really runs.
    env = {**os.environ, "CXX": "/bin/false", "LLMOPT_CACHE": str(tmp_path)}
    env.pop("LLMOPT_REQUIRE_KERNELS", None)
    if required:
        env["LLMOPT_REQUIRE_KERNELS"] = "1"
    code = "from llmopt.engine import kernels; print(kernels.load())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if required:
        assert result.returncode != 0 and "LLMOPT_REQUIRE_KERNELS" in result.stderr
    else:
        assert result.returncode == 0 and result.stdout.strip() == "False"


def test_two_installs_build_into_folders_of_their_own(monkeypatch, tmp_path):
    """ninja's build file names its sources by path: two checkouts sharing one build folder rebuilt each
    other's kernels at every start, so the folder is keyed on where the sources are."""
    here = kernels.sources_key()
    monkeypatch.setattr(kernels, "CSRC", tmp_path)
    assert kernels.sources_key() != here and len(here) == 10
