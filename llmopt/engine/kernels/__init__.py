"""Compiled CPU kernels of the engine (cpu_kernels.cpp beside this file), built once per machine on first use.

The build needs a C++ compiler; where there is none, the engine falls back to plain PyTorch ops and
says so in the log.
"""

from __future__ import annotations

import functools
import logging
import os
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
    """Build (or load the cached build of) the kernels; False where they cannot be built."""
    if os.environ.get("LLMOPT_NO_KERNELS"):
        return False
    try:
        import ninja  # the pip package, so that a fresh venv needs no system ninja
        from torch.utils.cpp_extension import load as build

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        build_dir = cache_dir().parent / "kernels" / f"torch-{torch.__version__}"
        build_dir.mkdir(parents=True, exist_ok=True)
        build(
            name="llmopt_kernels",
            sources=[str(CSRC / "cpu_kernels.cpp")],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
        return True
    except Exception as exc:  # no compiler, no headers: slower, still correct
        log.warning("compiled kernels unavailable (%s); using PyTorch's attention instead", str(exc)[:200])
        return False
