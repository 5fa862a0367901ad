"""The int8 KV cache (--kv-cache-dtype int8): its kernels against PyTorch references over the same int8
cache and against fp32 attention, the pool it buys, and greedy decoding against the fp32 model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers import int8_kv_cache
from llmopt.engine.layers.attention import AttentionMetadata, rope_and_cache

needs_kernels = pytest.mark.skipif(not kernels.load(), reason="no C++ compiler: the engine runs PyTorch ops")


def reference_attention(q, k_cache, v_cache, block_tables, context_lens, window=0) -> torch.Tensor:
    """SDPA over each row's context, read from the caches (dequantized first where they are int8)."""
    if k_cache.dtype == torch.int8:
        k_cache, v_cache = int8_kv_cache.dequantize(k_cache), int8_kv_cache.dequantize(v_cache)
    rows = []
    for row, length in enumerate(context_lens.tolist()):
        first = max(0, length - window) if window else 0
        keys = k_cache[block_tables[row]].flatten(0, 1)[first:length].transpose(0, 1)  # [kv_heads, n, D]
        values = v_cache[block_tables[row]].flatten(0, 1)[first:length].transpose(0, 1)
        rows.append(F.scaled_dot_product_attention(q[row][:, None], keys, values, enable_gqa=True)[:, 0])
    return torch.stack(rows)


@needs_kernels
@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (64, 32), (8, 128), (1, 64), (16, 256)])
@pytest.mark.parametrize("window", [0, 5, 37])
def test_int8_decode_attention_matches_sdpa_over_the_dequantized_cache(block_size, head_dim, window):
    """Contexts that end inside a block, on its edge and span many blocks placed anywhere in the pool,
    whole or through a sliding window; and within int8 error of fp32 attention on the unquantized cache."""
    torch.manual_seed(block_size + head_dim)
    context_lens = torch.tensor(
        [1, max(1, block_size - 1), block_size, block_size + 1, 5 * block_size + 3, 77]
    )
    max_blocks = -(-int(context_lens.max()) // block_size)
    heads, kv_heads, num_blocks = 9, 3, 6 * max_blocks + 10
    k_fp32 = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    v_fp32 = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = int8_kv_cache.quantize(k_fp32), int8_kv_cache.quantize(v_fp32)
    block_tables = torch.randperm(num_blocks)[: 6 * max_blocks].view(6, max_blocks)
    q = torch.randn(6, heads, head_dim)
    out = torch.ops.llmopt.paged_decode_attention_int8(
        q, k_cache, v_cache, block_tables, context_lens, head_dim**-0.5, window
    )
    expected = reference_attention(q, k_cache, v_cache, block_tables, context_lens, window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    fp32 = reference_attention(q, k_fp32, v_fp32, block_tables, context_lens, window)
    # int8 rounds each element by at most scale / 2 = max|x| / 254: ~1 % of a unit-normal row's range.
    assert (out - fp32).abs().max() < 0.05


@needs_kernels
def test_int8_cache_write_quantizes_as_the_pytorch_path_does():
    tokens, heads, kv_heads, dim, block = 5, 9, 3, 64, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim)
    cos, sin = torch.randn(tokens, 1, dim), torch.randn(tokens, 1, dim)
    slots = torch.tensor([3, 17, 18, 40, 2])
    caches = {}
    for use_kernels in (True, False):
        meta = AttentionMetadata(slots, cos, sin, 0, use_kernels, None, None)
        k_cache, v_cache = torch.zeros(2, 4, block, kv_heads, dim + 4, dtype=torch.int8)
        q = rope_and_cache(qkv, k_cache, v_cache, meta, heads, kv_heads, dim)
        caches[use_kernels] = (q, k_cache, v_cache)
    (q, k, v), (q_ref, k_ref, v_ref) = caches[True], caches[False]
    torch.testing.assert_close(q, q_ref)
    assert torch.equal(v, v_ref)  # no arithmetic before the quantization: bit for bit
    # Keys are rotated first, where the kernel's fused multiply-adds may round an ulp differently.
    assert (k[..., :dim].int() - k_ref[..., :dim].int()).abs().max() <= 1
    torch.testing.assert_close(
        int8_kv_cache.dequantize(k), int8_kv_cache.dequantize(k_ref), rtol=0, atol=0.02
    )
    written = k.view(-1, kv_heads, dim + 4)
    assert written[slots].any() and not written[[0, 1, 4]].any()  # only the tokens' slots


def test_quantize_round_trip_and_zero_rows():
    x = torch.randn(7, 3, 64) * torch.logspace(-3, 3, 7)[:, None, None]
    x[2, 1] = 0
    rows = int8_kv_cache.quantize(x)
    assert rows.shape == (7, 3, 68) and rows.dtype == torch.int8
    back = int8_kv_cache.dequantize(rows)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((back - x).abs() <= step / 2 + 1e-6 * x.abs()).all()  # within half a step everywhere
    assert back[2, 1].eq(0).all()


def test_an_int8_pool_holds_about_four_times_the_blocks():
    """SmolLM2-135M's shape (30 layers, 3 KV heads, head_dim 64): 68 bytes a token-head row instead of 256."""
    fp32_row, fp32 = int8_kv_cache.cache_row(64, "auto", torch.float32)
    int8_row, int8 = int8_kv_cache.cache_row(64, "int8", torch.float32)
    assert (fp32_row, fp32, int8_row, int8) == (64, torch.float32, 68, torch.int8)
    fp32_blocks = int8_kv_cache.pool_blocks(1.0, 30, (16, 3, fp32_row), fp32)
    int8_blocks = int8_kv_cache.pool_blocks(1.0, 30, (16, 3, int8_row), int8)
    assert fp32_blocks == 2**30 // (2 * 30 * 16 * 3 * 64 * 4) == 1456
    assert int8_blocks == 2**30 // (2 * 30 * 16 * 3 * 68) == 5482  # 3.76x
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto or int8, not 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8")


@pytest.mark.model
def test_greedy_decoding_with_int8_kv_agrees_with_the_fp32_model(model_dir, hf_model):
    """Greedy decoding on an int8 cache (decode_layers where the kernels run), teacher-forced through
    the fp32 model: its next token agrees at >= 95 % of positions."""
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams

    llm = LLM(str(model_dir), num_kv_blocks=32, kv_cache_dtype="int8")
    assert llm.engine.runner.kv_cache.dtype == torch.int8
    prompts = [llm.tokenizer.encode(p) for p in ("The history of the city begins", "def fibonacci(n):")]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))
    agree = total = 0
    for prompt, out in zip(prompts, outputs):
        with torch.inference_mode():
            logits = hf_model(torch.tensor([prompt + out.token_ids])).logits[0]
        predicted = logits[len(prompt) - 1 : -1].argmax(-1)
        agree += int((predicted == torch.tensor(out.token_ids)).sum())
        total += len(out.token_ids)
    assert agree >= 0.95 * total, f"{agree} of {total} positions agree"


@needs_kernels
def test_decode_layers_on_an_int8_cache_equal_the_per_layer_path(model_dir):
    """decode_layers takes the int8 cache's write and attention: the same logits as layer by layer."""
    from llmopt.engine.model_runner import MAX_DECODE_QUERIES, ModelRunner

    config = EngineConfig(str(model_dir), num_kv_blocks=4, kv_cache_dtype="int8")
    runner = ModelRunner(config, model_dir, max_model_len=64)
    model = runner.model
    assert model.decode_weights and runner.kv_cache.dtype == torch.int8
    token_ids = list(range(100, 100 + MAX_DECODE_QUERIES))  # short enough to be decode rows
    one_call = runner.prompt_logits(token_ids)
    weights, model.decode_weights = model.decode_weights, None
    per_layer = runner.prompt_logits(token_ids)
    model.decode_weights = weights
    assert torch.equal(one_call, per_layer)
