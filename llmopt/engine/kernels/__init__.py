"""Compiled CPU kernels of the engine (cpu_kernels.cpp beside this file), built once per machine on first use.

The build needs a C++ compiler; where there is none, the engine falls back to plain PyTorch ops and
says so in the log.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from llmopt.checkpoints import cache_dir

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent
# What the decode-attention kernel handles (see cpu_kernels.cpp); other models use PyTorch's SDPA.
HEAD_DIMS = (32, 64, 128, 256)
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

    # -march=native: a build is only valid on a CPU with the same instruction sets, so the folder is
    # keyed on them (a cached AVX-512 build loaded on an AVX2 machine dies of an illegal instruction), and
    # on the sources' folder: ninja's build file names the sources by path, so two installs (two
    # checkouts, a venv and a wheel) sharing one folder rebuilt each other's kernels at every start
    # (measured: a first start of 121 s instead of 10).
    build_dir = (
        cache_dir().parent / "kernels" / f"torch-{torch.__version__}-{cpu_flags_key()}-{sources_key()}"
    )
    build_dir.mkdir(parents=True, exist_ok=True)
    with ninja_on_path(ninja.BIN_DIR):
        load_extension(
            name="llmopt_kernels",
            # Every .cpp here is one extension; only cpu_kernels.cpp declares TORCH_LIBRARY(llmopt),
            # the others add their ops with TORCH_LIBRARY_FRAGMENT(llmopt, m).
            sources=[str(path) for path in sorted(CSRC.glob("*.cpp"))],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )


def sources_key() -> str:
    """A short name for the folder of the kernel sources this build compiles."""
    return hashlib.sha256(str(CSRC.resolve()).encode()).hexdigest()[:10]


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags as Linux reports them; empty where /proc/cpuinfo is absent."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_flags_key() -> str:
    """A short name for the vector instruction sets the build may use."""
    wanted = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    return hashlib.sha256(" ".join(wanted).encode()).hexdigest()[:10]


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


def vector_isa(flags: set[str] | None = None) -> str:
    """The widest vector instructions the kernels' -march=native build uses on this CPU (the #if
    branches of quantized_matmul.cpp and vector_math.h), for the start-up line."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512_vnni", "avx512bw"} <= flags:
        return "AVX-512 VNNI"
    if "avx512f" in flags:
        return "AVX-512"
    if {"avx2", "fma"} <= flags:
        return "AVX2 + AVX-VNNI" if "avx_vnni" in flags else "AVX2"
    return "scalar"
