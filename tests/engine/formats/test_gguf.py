"""GGUF tensors read natively: each block type against the `gguf` package's own dequantization (real
tensors of the bundled Q4_1 file, synthetic blocks for the types it lacks), the names and llama.cpp's
q/k row permutation undone (checked against the converted folder transformers wrote), the fallback for
types we do not serve natively, and the native model's greedy tokens against its dequantized copy."""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from llmopt.checkpoints import bundled_gguf_path, convert_gguf
from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.formats.gguf import NATIVE, hf_name, read_gguf, to_quantized
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.models.checkpoint_weights import read_safetensors
from tests.conftest import PROMPTS
from tests.test_checkpoints_gemma3 import CONTROL, tiny_gemma3_config, write_gemma3_gguf

RNG = np.random.default_rng(0)


def assert_like_gguf(data: np.ndarray, qtype: T, in_features: int) -> None:
    ours = to_quantized(data, qtype, in_features).dequantize().numpy()
    theirs = dequantize(data, qtype).reshape(ours.shape)
    # fp32 rounding of (q - zero) * scale against d * q + m: a few ulps of the largest weight
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=4e-7 * np.abs(theirs).max())


@pytest.fixture(scope="module")
def bundled() -> gguf.GGUFReader:
    return gguf.GGUFReader(bundled_gguf_path())


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_the_bundled_files_tensors_dequantize_as_gguf_does(bundled, qtype):
    tensors = [t for t in bundled.tensors if t.tensor_type == qtype][:3]
    assert tensors, f"the bundled file has no {qtype.name} tensor"
    for tensor in tensors:
        assert_like_gguf(tensor.data, qtype, int(tensor.shape[0]))


def synthetic_k_blocks(qtype: T, rows: int, cols: int) -> np.ndarray:
    """gguf-py cannot quantize K types: random bytes are valid blocks once the fp16 fields are finite."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = RNG.integers(0, 256, (rows * cols // 256, block_bytes), dtype=np.uint8)
    halves = RNG.uniform(-0.1, 0.1, (len(blocks), 2)).astype(np.float16).view(np.uint8)
    if qtype == T.Q4_K:
        blocks[:, 0:4] = halves  # d and dmin
        blocks[0, 0:2] = 0  # a super-block whose sub-blocks are all flat (scale 0, offset only)
    else:
        blocks[:, 208:210] = halves[:, :2]
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", list(NATIVE), ids=lambda t: t.name)
def test_synthetic_blocks_of_each_native_type_dequantize_as_gguf_does(qtype):
    if qtype in (T.Q4_K, T.Q6_K):
        data = synthetic_k_blocks(qtype, 8, 512)
    else:
        weight = RNG.standard_normal((8, 512)).astype(np.float32)
        weight[3, :32] = 0.25  # a flat block: Q4_1 stores d = 0 and the value in m
        data = quantize(weight, qtype)
    assert_like_gguf(data, qtype, 512)


def test_q8_0_q5_0_and_q4_0_are_symmetric_with_the_canonical_zero_points():
    weight = RNG.standard_normal((4, 64)).astype(np.float32)
    assert set(to_quantized(quantize(weight, T.Q8_0), T.Q8_0, 64).zero.unique().tolist()) == {128.0}
    assert set(to_quantized(quantize(weight, T.Q4_0), T.Q4_0, 64).zero.unique().tolist()) == {8.0}
    q5 = to_quantized(quantize(weight, T.Q5_0), T.Q5_0, 64)  # widened to int8: the w8a8 kernel runs it
    assert (q5.bits, set(q5.zero.unique().tolist())) == (8, {128.0})
    assert int(q5.q.min()) >= 112 and int(q5.q.max()) <= 143  # 5-bit values, q - 16 around 128


@pytest.mark.skipif(not kernels.load(), reason="no C++ compiler: the engine runs PyTorch ops")
def test_q6_k_and_a_q4_k_m_style_mixed_fusion_run_in_the_panel_kernel():
    """Q6_K (6 bits, a scale per 16) runs as int8 in groups of 16; a fusion of Q4_K q and k with a Q6_K v
    (Q4_K_M's layers) takes the common form, 6 bits in groups of 16, with every weight unchanged."""
    q4_k = to_quantized(synthetic_k_blocks(T.Q4_K, 32, 512), T.Q4_K, 512)
    q6_k = to_quantized(synthetic_k_blocks(T.Q6_K, 16, 512), T.Q6_K, 512)
    assert QuantizedLinear(q6_k).kernel == "w8a8"
    fused = QuantizedWeight.cat([q4_k, q4_k, q6_k])
    assert (fused.bits, fused.group_size) == (6, 16)
    assert torch.equal(
        fused.dequantize(), torch.cat([q4_k.dequantize(), q4_k.dequantize(), q6_k.dequantize()])
    )
    layer = QuantizedLinear(fused)
    assert layer.kernel == "w8a8"
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    exact = x @ fused.dequantize().t()
    assert (layer(x) - exact).norm() / exact.norm() < 0.02  # what int8 activations cost


def test_names_map_onto_the_engines():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.1.attn_k.bias") == "model.layers.1.self_attn.k_proj.bias"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ssm_conv"):
        hf_name("blk.0.ssm_conv.weight")


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, T]], arch: str = "llama") -> None:
    writer = gguf.GGUFWriter(path, arch)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_types_fall_back_with_one_log_line_and_q_k_rows_are_unpermuted(tmp_path, caplog):
    heads, kv_heads, head_dim, hidden = 4, 2, 8, 64
    q = RNG.standard_normal((heads * head_dim, hidden)).astype(np.float32)
    k = RNG.standard_normal((kv_heads * head_dim, hidden)).astype(np.float32)
    path = tmp_path / "tiny.gguf"
    write_gguf(
        path,
        {
            "blk.0.attn_q.weight": (quantize(q, T.Q8_0), T.Q8_0),
            "blk.0.attn_k.weight": (quantize(k, T.Q5_1), T.Q5_1),
            "blk.0.attn_v.weight": (quantize(k, T.Q5_1), T.Q5_1),
            "blk.0.ffn_up.weight": (quantize(q, T.Q5_0), T.Q5_0),
            "blk.0.attn_norm.weight": (np.ones(hidden, np.float32), T.F32),
        },
    )
    with caplog.at_level(logging.WARNING):
        dense, quantized = read_gguf(path, heads, kv_heads)
    [record] = [r for r in caplog.records if "not served natively" in r.getMessage()]
    assert "Q5_1 (2 tensors)" in record.getMessage() and "Q5_0" not in record.getMessage()
    assert set(quantized) == {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"}
    assert dense["model.layers.0.input_layernorm.weight"].shape == (hidden,)
    # transformers' own reversal of llama.cpp's permutation is the reference
    processor = LlamaTensorProcessor({"num_attention_heads": heads, "num_key_value_heads": kv_heads})
    q_file = dequantize(quantize(q, T.Q8_0), T.Q8_0)
    q_ref = processor.process(q_file, "blk.0.attn_q.weight").weights
    assert torch.equal(quantized["model.layers.0.self_attn.q_proj"].dequantize(), torch.from_numpy(q_ref))
    k_ref = processor.process(dequantize(quantize(k, T.Q5_1), T.Q5_1), "blk.0.attn_k.weight").weights
    assert torch.equal(dense["model.layers.0.self_attn.k_proj.weight"], torch.from_numpy(k_ref))
    assert not torch.equal(torch.from_numpy(q_ref), torch.from_numpy(q_file))  # the check can fail


def test_gemma3_norms_lose_llamacpps_offset_and_the_tied_head_is_the_quantized_embedding(tmp_path):
    hidden, vocab = 64, 96
    embed = RNG.standard_normal((vocab, hidden)).astype(np.float32)
    norm = RNG.uniform(0.5, 2.0, hidden).astype(np.float32)  # llama.cpp's file holds 1 + w
    path = tmp_path / "gemma.gguf"
    tensors = {
        "token_embd.weight": (quantize(embed, T.Q8_0), T.Q8_0),
        "blk.0.ffn_norm.weight": (norm, T.F32),
        "blk.0.post_ffw_norm.weight": (norm, T.F32),
        "blk.0.ffn_gate.weight": (quantize(embed[:32], T.Q5_0), T.Q5_0),
    }
    write_gguf(path, tensors, arch="gemma3")
    dense, quantized = read_gguf(path, 4, 1)
    layer = "model.layers.0."
    for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
        torch.testing.assert_close(dense[f"{layer}{name}.weight"], torch.from_numpy(norm) - 1, rtol=0, atol=0)
    assert set(quantized) == {"lm_head", layer + "mlp.gate_proj"}
    assert torch.equal(quantized["lm_head"].dequantize(), dense["model.embed_tokens.weight"])


def test_a_gemma3_gguf_at_its_own_precision_keeps_its_blocks_and_follows_its_fp32_copy(tmp_path, monkeypatch):
    """Q4_K_M's mix on a tiny llama.cpp-style Gemma 3 file: served with dtype "auto" its linears run
    quantized (Q5_0 widened to int8 beside a Q8_0 v in one fused qkv), the output layer is the file's
    Q8_0 embedding, and the logits stay near those of the fp32 copy of the same (dequantized) weights."""
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = tiny_gemma3_config(hidden_size=64, head_dim=32)
    model = AutoModelForCausalLM.from_config(config).eval()
    q5, q8 = T.Q5_0, T.Q8_0
    qtypes = {"attn_q": q5, "attn_k": q5, "attn_v": q8, "attn_output": T.Q4_0, "ffn_gate": q5, "ffn_up": q5}
    path = tmp_path / "tiny-gemma3.gguf"
    write_gemma3_gguf(path, model, config, {**qtypes, "ffn_down": q8, "token_embd": q8})
    folder = convert_gguf(path)
    runners = {
        dtype: ModelRunner(EngineConfig(str(path), dtype, num_kv_blocks=8), folder, max_model_len=64)
        for dtype in ("auto", "float32")
    }
    native = runners["auto"].model
    assert all(isinstance(layer.qkv_weight, QuantizedLinear) for layer in native.layers)
    assert isinstance(native.lm_head_t, QuantizedLinear) and isinstance(
        native.layers[1].o_weight, QuantizedLinear
    )
    if kernels.load():  # the panel kernels: int8 activations, as llama.cpp's dot products
        assert {native.layers[0].qkv_weight.kernel, native.layers[0].gate_up_weight.kernel} == {"w8a8"}
        assert native.layers[0].o_weight.kernel == "w4a8"
    ids = [2, *torch.randint(len(CONTROL), config.vocab_size, (15,)).tolist()]
    quantized, dense = (runner.prompt_logits(ids) for runner in runners.values())
    assert not torch.equal(quantized, dense)
    torch.testing.assert_close(quantized, dense, rtol=0, atol=0.05 * float(dense.abs().max()))


@pytest.fixture(scope="module")
def native_runner(model_dir) -> ModelRunner:
    return ModelRunner(EngineConfig(dtype="auto", num_kv_blocks=16), model_dir, max_model_len=256)


def test_native_q4_1_layers_equal_the_converted_folders(native_runner, model_dir):
    """The file's blocks, renamed and unpermuted, hold what transformers' GGUF conversion wrote."""
    model = native_runner.model
    assert "dense" not in {layer.qkv_weight.kernel for layer in model.layers}  # a 4-bit kernel runs them
    converted = read_safetensors(model_dir)
    attn = "model.layers.7.self_attn."
    qkv = torch.cat([converted[attn + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
    torch.testing.assert_close(model.layers[7].qkv_weight.dequantized_t().t(), qkv, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.embed, converted["model.embed_tokens.weight"], rtol=0, atol=0)


def test_native_q4_1_greedy_tokens_agree_with_its_dequantized_copy(native_runner, llm, hf_greedy):
    """Teacher-forced along transformers' greedy decode of the fp32 copy (prompts of under 128 tokens,
    so the int4 kernels run rather than the dequantized prefill GEMM)."""
    agree = total = 0
    for prompt in PROMPTS[:6]:
        ids = llm.tokenizer.encode(prompt)
        generated = hf_greedy(tuple(ids), 24)
        ours = native_runner.prompt_logits(ids + generated).argmax(-1)[len(ids) - 1 : -1]
        agree += int((ours == torch.tensor(generated)).sum())
        total += len(generated)
    assert agree / total >= 0.95, agree / total
