"""Every script under benchmarks/ still imports: a benchmark is run by hand, rarely, so a package name it
imports that moved (`llmopt.cli.bench.run_bench` once did) would otherwise be found only by the next
person who needs its figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # a fresh interpreter that imports torch and transformers: seconds
def test_every_benchmark_script_imports() -> None:
    modules = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
    assert "serve_vs_llamacpp" in modules
    # One fresh interpreter for all of them: the scripts import each other (harness, results) from their
    # folder, as `python benchmarks/X.py` does, and none runs anything at import.
    code = f"import importlib; [importlib.import_module(m) for m in {modules!r}]"
    done = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
