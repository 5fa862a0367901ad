"""A GGUF model as the engine loaded it (its blocks repacked into the kernels' panels), kept on disk
(llmopt/load_cache.py) so that a later start maps it in instead of building it again: loading the
bundled Q4_1 model took 0.55 s of a 3.5 s warm start here, mapping the saved one 0.01 s. This is the
only thing a GGUF start writes besides its tokenizer; it is about the size of the model in memory, one
folder a model file under $LLMOPT_CACHE/loaded (default ~/.cache/llmopt/loaded), and `rm -r` of that
folder is always safe: the next start builds it again.

The folder is named by the file's stem and content fingerprint (and `-q4_0` for a draft's copy); the
saved file's name hashes the rest it depends on (dtype, output layer, kernel choice, torch, the engine's
sources), so a new llmopt with other classes or layouts writes a new file instead of reading a stale one.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from llmopt.checkpoints import cache_dir, file_fingerprint, is_gguf
from llmopt.engine import kernels
from llmopt.engine.layers.quantized_linear import kernel_choice
from llmopt.engine.models import huge_pages
from llmopt.engine.models.loader import load_model
from llmopt.load_cache import load_or_build

log = logging.getLogger(__name__)

ENGINE_SOURCES = Path(__file__).resolve().parents[1]  # llmopt/engine: every class a saved model holds
FORMAT_VERSION = 1
FOLDER = "loaded"
KEEP = 1  # saved models a model's folder keeps: this llmopt's only, so the cache stays one model's size


def saved_models_dir() -> Path:
    return cache_dir().parent / FOLDER


def load_model_cached(
    checkpoint: Path, dtype: torch.dtype, native_gguf: bool, lm_head_dtype: str, q4_0: bool = False
):
    """load_model(...), from the saved copy when there is one; only a GGUF read natively is kept (an
    HF folder's weights would have to be hashed, about what loading them costs)."""
    if not (native_gguf and is_gguf(checkpoint)):
        return load_model(checkpoint, dtype, native_gguf, lm_head_dtype, q4_0)
    # A draft's Q4_0 copy has a folder of its own: the same file served as a model keeps its saved copy.
    variant = "-q4_0" if q4_0 else ""
    folder = saved_models_dir() / f"{checkpoint.stem}-{file_fingerprint(checkpoint)[:16]}{variant}"
    return load_or_build(
        folder / f"{cache_key(checkpoint, dtype, lm_head_dtype)}.pt",
        lambda: load_model(checkpoint, dtype, native_gguf, lm_head_dtype, q4_0),
        map_saved,
        huge_pages.save,
        KEEP,
        # The start that builds maps the saved file too: its built copy sits mostly in 4 KB pages, and the
        # mapped one ran 1.01-1.02x at one stream and 1.00-1.02x at four (1.5B, benchmarks/huge_pages.py).
        read_back=True,
    )


def map_saved(path: Path):
    """The saved model, mapped, its file cached in 2 MB pages (huge_pages.py) first."""
    share = huge_pages.cache_in_huge_pages(path)
    if share is not None:
        log.info("weights mapped from %s, %.0f %% of them in 2 MB pages", path, 100 * share)
    # Unpickling runs code: the file is ours, written by torch.save into the user's own cache folder.
    return torch.load(path, mmap=True, weights_only=False)


def cache_key(gguf: Path, dtype: torch.dtype, lm_head_dtype: str) -> str:
    parts = [
        f"format {FORMAT_VERSION}",
        file_fingerprint(gguf),
        str(dtype),
        lm_head_dtype,
        kernel_choice(),
        f"kernels {kernels.load()}",
        torch.__version__,
        sources_digest(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def sources_digest() -> str:
    """The engine's sources' content (about 5 ms to read here): its Python and its kernels' C++, which
    read the saved panels' layout (a layout the kernel alone changes must not map in a stale file)."""
    digest = hashlib.sha256()
    paths = [p for pattern in ("*.py", "*.cpp", "*.h") for p in ENGINE_SOURCES.rglob(pattern)]
    for path in sorted(paths):
        digest.update(path.relative_to(ENGINE_SOURCES).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
