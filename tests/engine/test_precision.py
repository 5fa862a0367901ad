"""`--dtype auto`, the default everywhere: each checkpoint in its own format. The resolver per case (a
GGUF, compressed-tensors, bf16 with and without the CPU's bf16 instructions, fp32, an explicit dtype),
and on the real default model and a real compressed-tensors checkpoint, what the start-up line says
runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers import gguf_panels
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.precision import resolve_precision
from llmopt.engine_servers.options import ServeOptions

BF16_CPU = {"avx2", "fma", "avx512f", "avx512_bf16"}
AVX2_CPU = {"avx2", "fma"}


def folder(tmp_path: Path, **config) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return tmp_path


def test_auto_is_the_default_of_the_engine_and_of_every_served_engine():
    assert EngineConfig().dtype == "auto" and ServeOptions().dtype == "auto"


def test_a_gguf_is_read_natively_at_fp32_activations():
    p = resolve_precision("auto", bundled_gguf_path(), AVX2_CPU)
    assert p.native_gguf and p.compute == torch.float32 and "GGUF" in p.reason


def test_a_gguf_at_an_explicit_dtype_is_dequantized_to_it():
    for dtype, compute in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        p = resolve_precision(dtype, bundled_gguf_path(), BF16_CPU)
        assert not p.native_gguf and p.compute == compute and p.reason == "asked for"


def test_compressed_tensors_run_their_own_quantized_weights(tmp_path):
    qconfig = {"quant_method": "compressed-tensors", "config_groups": {}}
    model_dir = folder(tmp_path, quantization_config=qconfig, torch_dtype="bfloat16")
    p = resolve_precision("auto", model_dir)
    assert not p.native_gguf and p.compute == torch.float32 and "quantized" in p.reason


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_a_half_precision_checkpoint_is_bf16_only_where_the_cpu_has_bf16_matmuls(tmp_path, stored):
    model_dir = folder(tmp_path, torch_dtype=stored)
    assert resolve_precision("auto", model_dir, BF16_CPU).compute == torch.bfloat16
    assert resolve_precision("auto", model_dir, AVX2_CPU).compute == torch.float32


def test_fp32_stays_fp32_and_an_explicit_dtype_is_taken_as_asked(tmp_path):
    model_dir = folder(tmp_path, torch_dtype="float32")
    assert resolve_precision("auto", model_dir, BF16_CPU).compute == torch.float32
    asked = resolve_precision("float32", model_dir, BF16_CPU)
    assert not asked.native_gguf and asked.compute == torch.float32 and asked.reason == "asked for"
    assert resolve_precision("bfloat16", model_dir, AVX2_CPU).compute == torch.bfloat16


def test_the_default_model_runs_its_q4_1_blocks_and_says_so():
    gguf = bundled_gguf_path()
    runner = ModelRunner(EngineConfig(num_kv_blocks=4), gguf, max_model_len=64)
    line = runner.startup_line
    assert runner.precision.native_gguf and runner.dtype == torch.float32
    assert "[the GGUF file's own quantized blocks]" in line and "KV cache float32, 64 tokens" in line
    if gguf_panels.supported():  # the file's Q4_1 layers and its tied Q8_0 embedding as the output layer
        assert line.startswith("--dtype auto: weights Q4_1 (GGUF kernel) x120 [")
        assert "lm_head Q8_0 (GGUF kernel)" in line
    else:
        assert (
            line.startswith("--dtype auto: weights 4-bit g32 (") and "lm_head int8 g32 (w8a8 kernel)" in line
        )
    fp32 = ModelRunner(EngineConfig(dtype="float32", num_kv_blocks=4), gguf, max_model_len=64)
    assert fp32.startup_line.startswith(
        "--dtype float32: weights float32 [asked for]; lm_head float32 (dense)"
    )


def test_a_compressed_tensors_checkpoint_runs_its_int8_weights_and_says_so(int8_dir):
    runner = ModelRunner(EngineConfig(str(int8_dir), num_kv_blocks=4), int8_dir, max_model_len=64)
    assert "weights 8-bit" in runner.startup_line
    assert "[the checkpoint's own quantized weights]" in runner.startup_line
