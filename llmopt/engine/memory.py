"""The memory a start takes, decided before anything is loaded: the KV pool's default size, which follows
the model and the memory free beside it (as vLLM's utilization fraction and llama.cpp's context size do,
where a fixed 1 GiB held 18,724 tokens of Qwen2.5-Coder-1.5B and 9,362 of a 7B), and the check that
the weights and the pool fit at all, so a file too large for the machine is one clear error naming it
rather than the kernel's out-of-memory kill halfway through its load."""

from __future__ import annotations

import os
from pathlib import Path

from llmopt.checkpoints import ModelError, is_gguf
from llmopt.gguf_file import read_gguf_file

GIB = 2**30
# The pool's default: this share of the memory available once the weights are in, within these bounds.
# A pool's pages are only taken as blocks are first written (model_runner.zeroed_on_first_touch), so a
# large default costs nothing until sequences fill it.
KV_SHARE = 0.25
KV_MIN_GB, KV_MAX_GB = 0.25, 16.0
# What a start needs beyond the weights and the pool: the interpreter, torch, tokenizer, buffers
# (about 0.6 GB measured for the 135M model with a cold pool).
OVERHEAD_BYTES = 1 * GIB


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be taken without swapping), else the free pages."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weights_bytes(checkpoint: Path, native_gguf: bool, value_bytes: int) -> int:
    """What the loaded weights take: a GGUF read natively about its file's size (its blocks at their own
    width), dequantized `value_bytes` a weight; a folder its safetensors' size."""
    checkpoint = Path(checkpoint)
    if is_gguf(checkpoint):
        if native_gguf:
            return checkpoint.stat().st_size
        return sum(_values(info.shape) for info in read_gguf_file(checkpoint).tensors.values()) * value_bytes
    return sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))


def _values(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def default_kv_gb(weights: int, available: int | None = None) -> float:
    """The pool's size when none is asked for: KV_SHARE of what is free after the weights."""
    free = (available_bytes() if available is None else available) - weights - OVERHEAD_BYTES
    return min(KV_MAX_GB, max(KV_MIN_GB, KV_SHARE * free / GIB))


def check_fits(checkpoint: Path, weights: int, kv_bytes: int, available: int | None = None) -> None:
    """A ModelError, before loading, when the weights and the pool cannot fit in the memory free now."""
    free = available_bytes() if available is None else available
    needed = weights + kv_bytes + OVERHEAD_BYTES
    if needed > free:
        raise ModelError(
            f"{checkpoint} needs about {needed / GIB:.1f} GiB ({weights / GIB:.1f} for its weights, "
            f"{kv_bytes / GIB:.1f} for the KV cache, {OVERHEAD_BYTES / GIB:.0f} for the rest) but "
            f"{free / GIB:.1f} GiB are available: free memory, serve a smaller quantization of the model, "
            "or lower --kv-cache-memory-gb / --num-kv-blocks"
        )
