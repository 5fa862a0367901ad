"""`--dtype auto`, the default everywhere: each checkpoint in its own format. The resolver per case (a
GGUF, compressed-tensors, bf16 with and without the CPU's bf16 instructions, fp32, an explicit dtype),
and on the real default model and a real compressed-tensors checkpoint, what the start-up line says
runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmopt.checkpoints import converted_folder
from llmopt.engine.config import EngineConfig
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.precision import resolve_precision
from llmopt.engines.options import ServeOptions

BF16_CPU = {"avx2", "fma", "avx512f", "avx512_bf16"}
AVX2_CPU = {"avx2", "fma"}


def folder(tmp_path: Path, **config) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return tmp_path


def test_auto_is_the_default_of_the_engine_and_of_every_served_engine():
    assert EngineConfig().dtype == "auto" and ServeOptions().dtype == "auto"


@pytest.fixture
def gguf(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_a_gguf_is_read_natively_at_fp32_activations(gguf):
    p = resolve_precision("auto", str(gguf), folder(converted_folder(gguf), torch_dtype="float32"), AVX2_CPU)
    assert p.gguf == gguf and p.compute == torch.float32 and "GGUF" in p.reason


def test_the_gguf_is_read_only_for_its_own_converted_folder(gguf, tmp_path):
    """No model named (the default) beside another checkpoint's folder: that folder's weights load."""
    other = folder(tmp_path / "gptq", torch_dtype="float32")
    assert resolve_precision("auto", None, other, AVX2_CPU).gguf is None
    assert resolve_precision("auto", str(gguf), other, AVX2_CPU).gguf is None


def test_a_gguf_of_an_architecture_not_read_natively_runs_its_fp32_copy(gguf):
    p = resolve_precision("auto", str(gguf), folder(converted_folder(gguf), model_type="mixtral"), AVX2_CPU)
    assert p.gguf is None and p.compute == torch.float32


def test_compressed_tensors_run_their_own_quantized_weights(tmp_path):
    qconfig = {"quant_method": "compressed-tensors", "config_groups": {}}
    model_dir = folder(tmp_path, quantization_config=qconfig, torch_dtype="bfloat16")
    p = resolve_precision("auto", str(model_dir), model_dir)
    assert p.gguf is None and p.compute == torch.float32 and "quantized" in p.reason


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_a_half_precision_checkpoint_is_bf16_only_where_the_cpu_has_bf16_matmuls(tmp_path, stored):
    model_dir = folder(tmp_path, torch_dtype=stored)
    assert resolve_precision("auto", str(model_dir), model_dir, BF16_CPU).compute == torch.bfloat16
    assert resolve_precision("auto", str(model_dir), model_dir, AVX2_CPU).compute == torch.float32


def test_fp32_stays_fp32_and_an_explicit_dtype_is_taken_as_asked(tmp_path, gguf):
    model_dir = folder(converted_folder(gguf), torch_dtype="float32")
    assert resolve_precision("auto", str(model_dir), model_dir, BF16_CPU).compute == torch.float32
    asked = resolve_precision("float32", str(gguf), model_dir, BF16_CPU)
    assert asked.gguf is None and asked.compute == torch.float32 and asked.reason == "asked for"
    assert resolve_precision("bfloat16", None, model_dir, AVX2_CPU).compute == torch.bfloat16


def test_the_default_model_runs_its_q4_1_blocks_and_says_so(model_dir):
    runner = ModelRunner(EngineConfig(num_kv_blocks=4), model_dir, max_model_len=64)
    line = runner.startup_line
    assert runner.precision.gguf is not None and runner.dtype == torch.float32
    assert (
        line.startswith("--dtype auto: weights 4-bit g32 (")
        and "[the GGUF file's own quantized blocks]" in line
    )
    assert "lm_head int8 g32 (w8a8 kernel)" in line and "KV cache float32" in line
    fp32 = ModelRunner(EngineConfig(dtype="float32", num_kv_blocks=4), model_dir, max_model_len=64)
    assert fp32.startup_line.startswith(
        "--dtype float32: weights float32 [asked for]; lm_head float32 (dense)"
    )


def test_a_compressed_tensors_checkpoint_runs_its_int8_weights_and_says_so(int8_dir):
    runner = ModelRunner(EngineConfig(str(int8_dir), num_kv_blocks=4), int8_dir, max_model_len=64)
    assert "weights 8-bit" in runner.startup_line
    assert "[the checkpoint's own quantized weights]" in runner.startup_line
