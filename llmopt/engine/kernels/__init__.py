"""Compiled CPU kernels of the engine (cpu_kernels.cpp beside this file), built once per machine on first use.

The build needs a C++ compiler; where there is none, the engine falls back to plain PyTorch ops and
says so in the log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from llmopt.checkpoints import cache_dir

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent
# What the decode-attention kernel handles (see cpu_kernels.cpp); other models use PyTorch's SDPA.
HEAD_DIMS = (32, 64, 128)
MAX_GROUP = 16
MAX_BLOCK_SIZE = 64


@functools.cache  # one build per process: the library registers its ops in torch.ops.llmopt
def load() -> bool:
    """Build (or load the cached build of) the kernels; False where they cannot be built, unless
    LLMOPT_REQUIRE_KERNELS is set (CI), where a failed build is an error instead of a silent fallback."""
    if os.environ.get("LLMOPT_NO_KERNELS"):
        return False
    try:
        build()
        return True
    except Exception as exc:  # no compiler, no headers: slower, still correct
        if os.environ.get("LLMOPT_REQUIRE_KERNELS"):
            raise RuntimeError(f"LLMOPT_REQUIRE_KERNELS is set and the kernels did not build: {exc}") from exc
        log.warning("compiled kernels unavailable (%s); using PyTorch's attention instead", str(exc)[:200])
        return False


def build() -> None:
    import ninja  # the pip package, so that a fresh venv needs no system ninja
    from torch.utils.cpp_extension import load as load_extension

    build_dir = cache_dir().parent / "kernels" / f"torch-{torch.__version__}"
    build_dir.mkdir(parents=True, exist_ok=True)
    with ninja_on_path(ninja.BIN_DIR):
        load_extension(
            name="llmopt_kernels",
            sources=[str(CSRC / "cpu_kernels.cpp")],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )


@contextlib.contextmanager
def ninja_on_path(ninja_dir: str) -> Iterator[None]:
    """torch's extension builder runs `ninja` from PATH; the pip package's binary is found through PATH
    only for the build, and the process's PATH is restored after it."""
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = ninja_dir + os.pathsep + before
    try:
        yield
    finally:
        os.environ["PATH"] = before
