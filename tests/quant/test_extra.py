"""`llmopt quantize` without the `quant` extra: one line naming what to install, before any work.

llm-compressor (or datasets) is made unimportable the way a missing install looks to Python: a package
of that name earlier on PYTHONPATH whose import raises ModuleNotFoundError. The check runs once the
options are checked against the model's config.json, before its tokenizer or weights are read, so a
config.json alone is enough; the real model shows it happens before the first measurements (without
the check, llm-compressor was first imported half a minute in, after the "before" perplexity)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A llama-shaped config.json is all `llmopt quantize` reads before it needs llm-compressor.
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def quantize_without(package: str, model: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    blocked = tmp_path / "blocked" / package
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{package}'\", name={package!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked.parent), os.getcwd()])}
    args = ["quantize", str(model), "--method", "int8", "--out", str(tmp_path / "out"), "--eval-windows", "1"]
    return subprocess.run(
        [sys.executable, "-m", "llmopt.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


def assert_one_line_naming_the_extra(result: subprocess.CompletedProcess, package: str, out: Path) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert "pip install 'llmopt[quant]'" in line and f"No module named '{package}'" in line, line
    assert not out.exists()


@pytest.mark.parametrize("package", ["llmcompressor", "datasets"])
@pytest.mark.slow
def test_quantize_without_the_extra_is_one_line_naming_it(tmp_path: Path, package: str):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    result = quantize_without(package, model, tmp_path)
    assert_one_line_naming_the_extra(result, package, tmp_path / "out")


def test_quantize_the_real_model_without_the_extra_fails_before_any_work(tmp_path: Path, model_dir: Path):
    result = quantize_without("llmcompressor", model_dir, tmp_path)
    assert_one_line_naming_the_extra(result, "llmcompressor", tmp_path / "out")
