"""Quantized copies of the default model, made once per test session: INT8 through the CLI (as a user
runs it), GPTQ and AWQ through the job function with a small calibration set to keep the suite fast."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmopt.quant.quantize import QuantizeConfig, quantize
from tests.test_cli import llmopt


@pytest.fixture(scope="session")
def int8_run(tmp_path_factory, model_dir) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("int8") / "ckpt"
    args = ("quantize", "--method", "int8", "--out", str(out), "--calib-samples", "8", "--eval-windows", "1")
    result = llmopt(*args, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, result


@pytest.fixture(scope="session")
def int8_dir(int8_run) -> Path:
    return int8_run[0]


def quantized(tmp_path_factory, method: str, samples: int, seq_len: int) -> Path:
    out = tmp_path_factory.mktemp(method) / "ckpt"
    config = QuantizeConfig(
        model=None, out=out, method=method, calib_samples=samples, seq_len=seq_len, eval_windows=1
    )
    quantize(config)
    return out


@pytest.fixture(scope="session")
def gptq_dir(tmp_path_factory, model_dir) -> Path:
    return quantized(tmp_path_factory, "gptq", samples=16, seq_len=128)


@pytest.fixture(scope="session")
def awq_dir(tmp_path_factory, model_dir) -> Path:
    return quantized(tmp_path_factory, "awq", samples=2, seq_len=64)
