"""`pip install .` as a user gets it: a wheel of this checkout, installed into a fresh virtualenv outside
it, runs `llmopt --help` and `llmopt cost` from another directory (the bundled pricing.toml must travel
in the wheel as package data, and so must llama.cpp's launcher script)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from llmopt.files import read_toml

ROOT = Path(__file__).resolve().parents[1]
# Top-level folders of a checkout that are not the source: caches, virtualenvs, bench results, and a
# previous in-tree build (a stale build/lib or egg-info can put files in the wheel that the source no
# longer has, so the wheel is built from a clean copy and the checkout is left as it was).
NOT_SOURCE = {
    ".git",
    ".venv",
    ".peer-venv",
    ".vllm-venv",
    ".guidellm-venv",
    "results",
    "build",
    "dist",
    "shared",
    ".pytest_cache",
    ".ruff_cache",
}


def ignore(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == ROOT
    return {n for n in names if (top and n in NOT_SOURCE) or n == "__pycache__" or n.endswith(".egg-info")}


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    # PIP_NO_INDEX: nothing may come from a registry; everything is on this machine already.
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # the checkout must not leak into the fresh environment
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh virtualenv with only the llmopt wheel installed in it."""
    base = tmp_path_factory.mktemp("wheel")
    assert ROOT not in base.resolve().parents, "the fresh environment must live outside the checkout"
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=ignore)
    wheels = base / "wheels"
    # --no-build-isolation: the build uses this virtualenv's setuptools instead of downloading one.
    build = ("wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    run(sys.executable, "-m", "pip", *build, cwd=base)
    [wheel] = wheels.glob("llmopt-*.whl")
    venv = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", wheel, cwd=base)
    # The wheel's dependencies (torch, transformers, ...) are not installed again: CI has no network
    # for a second torch. A .pth line appends this virtualenv's site-packages to the fresh one's
    # sys.path, after its own site-packages, so the wheel's llmopt is found first; .pth files inside
    # the appended folder (such as the checkout's editable-install hook) are not run.
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=base).stdout.strip()
    )
    deps = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "llmopt-test-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return venv / "bin"


@pytest.mark.slow
def test_the_installed_wheel_runs_from_another_folder(installed: Path, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(installed / "python", "-c", "import llmopt; print(llmopt.__file__)", cwd=elsewhere).stdout
    package = Path(where.strip()).resolve()
    assert installed.parent.resolve() in package.parents and ROOT not in package.parents, package

    assert "cost" in run(installed / "llmopt", "--help", cwd=elsewhere).stdout

    args = ("cost", "--prompt-tokens", "8000", "--output-tokens", "500", "--requests", "1000")
    out = run(installed / "llmopt", *args, cwd=elsewhere).stdout
    assert "8,000 prompt + 500 output tokens per request" in out and "$ for 1,000 requests" in out
    for model in read_toml(ROOT / "llmopt" / "pricing.toml")["model"][:2]:
        assert model["name"] in out

    # A user's own pricing file, named relative to where they are, still replaces the bundled one.
    (elsewhere / "mine.toml").write_text(
        '[[model]]\nname = "my-flat-deal"\nkind = "request"\nper_request = 0.5\n'
    )
    out = run(installed / "llmopt", *args, "--pricing", "mine.toml", cwd=elsewhere).stdout
    assert "my-flat-deal" in out and "$500.0000" in out and "gpt-4o-mini" not in out

    # llama.cpp's launcher script travels in the wheel: `--engine llama.cpp` runs the installed copy.
    (elsewhere / "m.gguf").write_bytes(b"GGUF")
    serve = ("serve", "m.gguf", "--engine", "llama.cpp", "--engine-python", "python3", "--dry-run")
    launcher = Path(run(installed / "llmopt", *serve, cwd=elsewhere).stdout.split()[1])
    assert launcher.name == "llama_cpp_server.py" and launcher.is_file()
    assert installed.parent.resolve() in launcher.resolve().parents, launcher
