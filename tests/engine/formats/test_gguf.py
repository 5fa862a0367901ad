"""GGUF tensors read natively: each block type against the `gguf` package's own dequantization (real
tensors of the bundled Q4_1 file, synthetic blocks for the types it lacks), the names and llama.cpp's
q/k row permutation undone (checked against the converted folder transformers wrote), the one-time
requantization of types with no exact kernel form, and the native model's greedy tokens against its
dequantized copy."""

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

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.formats.gguf import NATIVE, GGUFBlocks, GGUFTensors, as_q4_0, hf_name, to_quantized
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.engine.layers import gguf_panels
from llmopt.engine.layers.embedding import QuantizedEmbedding
from llmopt.engine.layers.quantized_linear import QuantizedLinear
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.models.checkpoint_weights import read_safetensors
from llmopt.gguf_file import GGUFFile, read_gguf_file
from tests.conftest import PROMPTS
from tests.test_checkpoints_gemma3 import CONTROL, tiny_gemma3_config, write_gemma3_gguf

RNG = np.random.default_rng(0)


def assert_like_gguf(data: np.ndarray, qtype: T, in_features: int) -> None:
    ours = to_quantized(data, qtype, in_features).dequantize().numpy()
    theirs = dequantize(data, qtype).reshape(ours.shape)
    # fp32 rounding of (q - zero) * scale against d * q + m: a few ulps of the largest weight
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=4e-7 * np.abs(theirs).max())


@pytest.fixture(scope="module")
def bundled() -> GGUFFile:
    return read_gguf_file(bundled_gguf_path())


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_the_bundled_files_tensors_dequantize_as_gguf_does(bundled, qtype):
    tensors = [t for t in bundled.tensors.values() if t.type == qtype][:3]
    assert tensors, f"the bundled file has no {qtype.name} tensor"
    for tensor in tensors:
        assert_like_gguf(bundled.read(tensor.name), qtype, tensor.shape[1])


# Where each super-block type keeps its fp16 fields (d, then dmin where it has one).
K_HALVES = {T.Q2_K: 80, T.Q3_K: 108, T.Q4_K: 0, T.Q5_K: 0, T.Q6_K: 208}
K_WITH_DMIN = (T.Q2_K, T.Q4_K, T.Q5_K)


def synthetic_k_blocks(qtype: T, rows: int, cols: int) -> np.ndarray:
    """gguf-py cannot quantize K types: random bytes are valid blocks once the fp16 fields are finite."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = RNG.integers(0, 256, (rows * cols // 256, block_bytes), dtype=np.uint8)
    fields = 2 if qtype in K_WITH_DMIN else 1
    halves = RNG.uniform(-0.1, 0.1, (len(blocks), fields)).astype(np.float16).view(np.uint8)
    start = K_HALVES[qtype]
    blocks[:, start : start + 2 * fields] = halves
    if qtype in K_WITH_DMIN:
        blocks[0, start : start + 2] = 0  # a super-block whose sub-blocks are all flat (scale 0, offset only)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", list(NATIVE), ids=lambda t: t.name)
def test_synthetic_blocks_of_each_native_type_dequantize_as_gguf_does(qtype):
    if qtype in K_HALVES:
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


def test_types_without_an_exact_form_are_requantized_once_and_q_k_rows_are_unpermuted(tmp_path, caplog):
    """IQ4_NL (a non-linear 4-bit code) has no canonical form: its layers are requantized to int8 in
    groups of 32, once, with one log line; every other type stays exact; llama.cpp's q/k row permutation
    is undone on quantized and requantized tensors alike."""
    heads, kv_heads, head_dim, hidden = 4, 2, 8, 64
    q = RNG.standard_normal((heads * head_dim, hidden)).astype(np.float32)
    k_blocks = RNG.integers(0, 256, (kv_heads * head_dim * hidden // 32, 18), dtype=np.uint8)
    k_blocks[:, :2] = RNG.uniform(0.01, 0.1, (len(k_blocks), 1)).astype(np.float16).view(np.uint8)
    k_data = k_blocks.reshape(kv_heads * head_dim, -1)
    path = tmp_path / "tiny.gguf"
    write_gguf(
        path,
        {
            "blk.0.attn_q.weight": (quantize(q, T.Q8_0), T.Q8_0),
            "blk.0.attn_k.weight": (k_data, T.IQ4_NL),
            "blk.0.attn_v.weight": (k_data, T.IQ4_NL),
            "blk.0.ffn_up.weight": (quantize(q, T.Q5_1), T.Q5_1),
            "blk.0.attn_norm.weight": (np.ones(hidden, np.float32), T.F32),
        },
    )
    tensors = GGUFTensors(read_gguf_file(path), heads, kv_heads, native=True)
    layer = "model.layers.0."
    taken = {name: tensors.take(name) for name in list(tensors.names())}
    with caplog.at_level(logging.WARNING):
        tensors.log_conversions()
    [record] = [r for r in caplog.records if "requantized" in r.getMessage()]
    assert "IQ4_NL (2 tensors)" in record.getMessage() and "Q5_1" not in record.getMessage()
    assert taken[layer + "input_layernorm.weight"].shape == (hidden,)
    assert isinstance(taken[layer + "mlp.up_proj.weight"], GGUFBlocks)  # Q5_1: kept as the file's blocks
    # transformers' own reversal of llama.cpp's permutation is the reference
    processor = LlamaTensorProcessor({"num_attention_heads": heads, "num_key_value_heads": kv_heads})
    q_file = dequantize(quantize(q, T.Q8_0), T.Q8_0)
    q_ref = processor.process(q_file, "blk.0.attn_q.weight").weights
    q_ours = taken[layer + "self_attn.q_proj.weight"].canonical().dequantize()
    assert torch.equal(q_ours, torch.from_numpy(q_ref))
    k_ref = torch.from_numpy(processor.process(dequantize(k_data, T.IQ4_NL), "blk.0.attn_k.weight").weights)
    k_ours = taken[layer + "self_attn.k_proj.weight"]
    assert (k_ours.bits, k_ours.group_size) == (8, 32)
    torch.testing.assert_close(k_ours.dequantize(), k_ref, rtol=0, atol=float(k_ref.abs().max()) / 254)
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
    gguf_tensors = GGUFTensors(read_gguf_file(path), 4, 1, native=True)
    layer = "model.layers.0."
    for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
        norm_read = gguf_tensors.take(f"{layer}{name}.weight")
        torch.testing.assert_close(norm_read, torch.from_numpy(norm) - 1, rtol=0, atol=0)
    assert gguf_tensors.quantized_linear(layer + "mlp.gate_proj.weight")
    head = gguf_tensors.tied_head()
    embedding = QuantizedEmbedding(*gguf_tensors.raw_blocks("model.embed_tokens.weight"), hidden)
    assert torch.equal(head.canonical().dequantize(), embedding.dense())
    assert torch.equal(embedding.dense(), torch.from_numpy(dequantize(quantize(embed, T.Q8_0), T.Q8_0)))


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
    runners = {
        dtype: ModelRunner(EngineConfig(str(path), dtype, num_kv_blocks=8), path, max_model_len=64)
        for dtype in ("auto", "float32")
    }
    native = runners["auto"].model
    assert all(isinstance(layer.qkv_weight, QuantizedLinear) for layer in native.layers)
    assert isinstance(native.lm_head_t, QuantizedLinear) and isinstance(
        native.layers[1].o_weight, QuantizedLinear
    )
    layer = native.layers[0]
    if gguf_panels.supported():  # each type at its own width: Q5_0 beside Q8_0 in one fused q/k/v
        assert {layer.qkv_weight.kernel, layer.gate_up_weight.kernel, layer.o_weight.kernel} == {"gguf"}
        assert set(layer.qkv_weight.gguf.types) == {"Q5_0", "Q8_0"}
    elif kernels.load():  # the generic panel kernels: int8 activations, as llama.cpp's dot products
        assert {layer.qkv_weight.kernel, layer.gate_up_weight.kernel} == {"w8a8"}
        assert layer.o_weight.kernel == "w4a8"
    ids = [2, *torch.randint(len(CONTROL), config.vocab_size, (15,)).tolist()]
    quantized, dense = (runner.prompt_logits(ids) for runner in runners.values())
    assert not torch.equal(quantized, dense)
    torch.testing.assert_close(quantized, dense, rtol=0, atol=0.05 * float(dense.abs().max()))


@pytest.fixture(scope="module")
def native_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(dtype="auto", num_kv_blocks=16), bundled_gguf_path(), max_model_len=256)


def test_native_q4_1_layers_equal_the_converted_folders(native_runner, model_dir):
    """The file's blocks, renamed and unpermuted, hold what transformers' GGUF conversion wrote."""
    model = native_runner.model
    assert "dense" not in {layer.qkv_weight.kernel for layer in model.layers}  # a 4-bit kernel runs them
    converted = read_safetensors(model_dir)
    attn = "model.layers.7.self_attn."
    qkv = torch.cat([converted[attn + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
    torch.testing.assert_close(model.layers[7].qkv_weight.dequantized_t().t(), qkv, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.embed.dense(), converted["model.embed_tokens.weight"], rtol=0, atol=0)


def test_native_q4_1_greedy_tokens_agree_with_its_dequantized_copy(native_runner, llm, hf_greedy):
    """Teacher-forced along transformers' greedy decode of the fp32 copy (prompts of under 128 tokens,
    so the int4 kernels run rather than the dequantized prefill GEMM)."""
    agreement = teacher_forced_agreement(native_runner, llm.tokenizer, hf_greedy)
    assert agreement >= 0.95, agreement


def teacher_forced_agreement(runner: ModelRunner, tokenizer, hf_greedy) -> float:
    """The share of transformers' greedy tokens (24 after each of six prompts, fp32 copy) that `runner`'s
    argmax gives, fed the same tokens."""
    agree = total = 0
    for prompt in PROMPTS[:6]:
        ids = tokenizer.encode(prompt)
        generated = hf_greedy(tuple(ids), 24)
        ours = runner.prompt_logits(ids + generated).argmax(-1)[len(ids) - 1 : -1]
        agree += int((ours == torch.tensor(generated)).sum())
        total += len(generated)
    return agree / total


def test_finer_blocks_requantize_to_what_ggufs_own_q4_0_quantization_gives(bundled):
    """A draft's Q8_0 (here the tied head) and any other linear: dequantized, then llama.cpp's reference
    Q4_0 rounding (the `gguf` package's), row chunk by row chunk."""
    for name in ("blk.3.ffn_up.weight", "token_embd.weight"):
        info = bundled.tensors[name]
        data = bundled.read(name)
        narrowed = as_q4_0(GGUFBlocks(data, info.type, info.shape[1]), name)
        assert narrowed.type == T.Q4_0 and narrowed.in_features == info.shape[1]
        assert np.array_equal(narrowed.data, quantize(dequantize(data, info.type), T.Q4_0))


def test_a_q4_0_draft_reads_fewer_bytes_and_stays_near_the_files_model(
    native_runner, llm, hf_greedy, caplog, tmp_path, monkeypatch
):
    """The bundled model as a draft takes it: its Q8_0 tied head in Q4_0 panels, its Q4_1 linears as they
    are (another 4-bit grid), a step's read smaller, teacher-forced greedy tokens mostly the fp32 copy's."""
    config = EngineConfig(dtype="auto", num_kv_blocks=16)
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))  # built here, not mapped from an earlier start's copy
    with caplog.at_level(logging.INFO):
        draft = ModelRunner(config, bundled_gguf_path(), max_model_len=256, q4_0=True)
    model = draft.model
    types = {t for layer in model.layers for w in (layer.qkv_weight, layer.down_weight) for t in w.gguf.types}
    assert types == {"Q4_1"} and model.lm_head_t.gguf.types == ["Q4_0"]
    assert draft.decode_weight_bytes < 0.9 * native_runner.decode_weight_bytes
    assert "1 Q8_0 linears requantized to Q4_0" in caplog.text
    agreement = teacher_forced_agreement(draft, llm.tokenizer, hf_greedy)
    assert agreement >= 0.8, agreement  # 0.85 (0.95 with the file's Q8_0 head)
