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
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine.config import EngineConfig
from llmopt.engine.formats.gguf import NATIVE, hf_name, read_gguf, to_quantized
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.models.loader import read_safetensors
from tests.conftest import PROMPTS

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


def test_q8_0_and_q4_0_are_symmetric_with_the_canonical_zero_points():
    weight = RNG.standard_normal((4, 64)).astype(np.float32)
    assert set(to_quantized(quantize(weight, T.Q8_0), T.Q8_0, 64).zero.unique().tolist()) == {128.0}
    assert set(to_quantized(quantize(weight, T.Q4_0), T.Q4_0, 64).zero.unique().tolist()) == {8.0}


def test_names_map_onto_the_engines():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.1.attn_k.bias") == "model.layers.1.self_attn.k_proj.bias"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ssm_conv"):
        hf_name("blk.0.ssm_conv.weight")


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, T]]) -> None:
    writer = gguf.GGUFWriter(path, "llama")
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
            "blk.0.attn_k.weight": (quantize(k, T.Q5_0), T.Q5_0),
            "blk.0.attn_v.weight": (quantize(k, T.Q5_1), T.Q5_1),
            "blk.0.ffn_up.weight": (quantize(q, T.Q5_0), T.Q5_0),
            "blk.0.attn_norm.weight": (np.ones(hidden, np.float32), T.F32),
        },
    )
    with caplog.at_level(logging.WARNING):
        dense, quantized = read_gguf(path, heads, kv_heads)
    [record] = [r for r in caplog.records if "not served natively" in r.getMessage()]
    assert "Q5_0 (2 tensors)" in record.getMessage() and "Q5_1 (1 tensors)" in record.getMessage()
    assert set(quantized) == {"model.layers.0.self_attn.q_proj"}
    assert dense["model.layers.0.input_layernorm.weight"].shape == (hidden,)
    # transformers' own reversal of llama.cpp's permutation is the reference
    processor = LlamaTensorProcessor({"num_attention_heads": heads, "num_key_value_heads": kv_heads})
    q_file = dequantize(quantize(q, T.Q8_0), T.Q8_0)
    q_ref = processor.process(q_file, "blk.0.attn_q.weight").weights
    assert torch.equal(quantized["model.layers.0.self_attn.q_proj"].dequantize(), torch.from_numpy(q_ref))
    k_ref = processor.process(dequantize(quantize(k, T.Q5_0), T.Q5_0), "blk.0.attn_k.weight").weights
    assert torch.equal(dense["model.layers.0.self_attn.k_proj.weight"], torch.from_numpy(k_ref))
    assert not torch.equal(torch.from_numpy(q_ref), torch.from_numpy(q_file))  # the check can fail


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
