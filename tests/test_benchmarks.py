"""Every script under benchmarks/ still imports: a benchmark is run by hand, rarely, so a package name it
imports that moved (`llmopt.cli.bench.run_bench` once did) would otherwise be found only by the next
person who needs its figure."""

from __future__ import annotations

import ast
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


def bench_imports_past_the_face(folder: Path = BENCHMARKS) -> list[str]:
    """Every import of a bench module other than the face (`from llmopt.bench import ...`), file:line."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.startswith("llmopt.bench.")]
    return found


def test_benchmarks_use_the_bench_through_its_face() -> None:
    """The bench's wings may move again: a benchmark names what it uses through llmopt.bench alone."""
    assert bench_imports_past_the_face() == []


def test_an_import_past_the_face_is_caught(tmp_path) -> None:
    (tmp_path / "good.py").write_text("from llmopt.bench import LocalServer, run_point\n")
    (tmp_path / "bad.py").write_text("import json\nfrom llmopt.bench.load.runner import run_point\n")
    assert bench_imports_past_the_face(tmp_path) == ["bad.py:2: llmopt.bench.load.runner"]


def test_every_name_of_the_face_loads() -> None:
    import llmopt.bench

    assert [name for name in llmopt.bench.__all__ if getattr(llmopt.bench, name, None) is None] == []
