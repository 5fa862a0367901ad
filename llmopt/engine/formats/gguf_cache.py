"""What `read_gguf` makes of a GGUF file, kept on disk so that a second start skips the parse (4.7 s of
the bundled file's 13 s start-up here, most of it the gguf package walking the 49k-token vocabulary).

One file per model and reader: named by the GGUF's content hash and by a hash of the reader's own source
(gguf.py, quantized_weight.py) with CACHE_VERSION, so a changed file, a changed reader or a changed layout
never reads a stale entry. Written to a temporary file beside it and renamed into place: two servers
starting at once both write whole files and either one's rename wins; a reader sees a whole file or none.
A file that fails to load is parsed again and rewritten."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from llmopt.checkpoints import cache_dir, file_digest
from llmopt.engine.formats import gguf as gguf_reader
from llmopt.engine.formats import quantized_weight
from llmopt.engine.formats.quantized_weight import QuantizedWeight

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # the file layout below: dense/NAME, quantized/PREFIX/{q,scale,zero}, metadata "quantized"
READER_SOURCES = (Path(gguf_reader.__file__), Path(quantized_weight.__file__))

Parsed = tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]


def reader_key() -> str:
    text = b"".join(path.read_bytes() for path in READER_SOURCES) + str(CACHE_VERSION).encode()
    return hashlib.sha256(text).hexdigest()[:12]


def cache_path(path: Path, num_heads: int, num_kv_heads: int) -> Path:
    name = f"{file_digest(path)[:16]}-h{num_heads}-{num_kv_heads}-r{reader_key()}.safetensors"
    return cache_dir().parent / "gguf-native" / name


def read_gguf_cached(path: Path, num_heads: int, num_kv_heads: int) -> Parsed:
    """`read_gguf(path, num_heads, num_kv_heads)`, from the cache when an entry for this content is there."""
    target = cache_path(path, num_heads, num_kv_heads)
    if target.is_file():
        try:
            return load_entry(target)
        except (SafetensorError, OSError, ValueError, KeyError) as exc:
            log.warning("%s: unreadable cache entry (%s); parsing the GGUF file again", target.name, exc)
    parsed = gguf_reader.read_gguf(path, num_heads, num_kv_heads)
    try:
        write_entry(target, *parsed)
    except OSError as exc:  # a read-only or full cache costs the next start its time, nothing else
        log.warning("could not cache the parsed GGUF at %s: %s", target, exc)
    return parsed


def write_entry(target: Path, dense: dict[str, torch.Tensor], quantized: dict[str, QuantizedWeight]) -> None:
    tensors = {f"dense/{name}": t.contiguous() for name, t in dense.items()}
    shapes = {}
    for prefix, w in quantized.items():
        tensors |= {f"quantized/{prefix}/{k}": getattr(w, k).contiguous() for k in ("q", "scale", "zero")}
        shapes[prefix] = [w.bits, w.group_size]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"quantized": json.dumps(shapes)})
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_entry(target: Path) -> Parsed:
    from safetensors import safe_open

    with safe_open(target, "pt") as f:
        shapes = json.loads(f.metadata()["quantized"])
    tensors = load_file(target)
    dense = {name.removeprefix("dense/"): t for name, t in tensors.items() if name.startswith("dense/")}
    quantized = {
        prefix: QuantizedWeight(
            *(tensors[f"quantized/{prefix}/{k}"] for k in ("q", "scale", "zero")), bits, group
        )
        for prefix, (bits, group) in shapes.items()
    }
    return dense, quantized
