"""What `read_gguf` makes of a GGUF file, kept on disk so that a second start skips the parse (4.7 s of
the bundled file's 13 s start-up here, most of it the gguf package walking the 49k-token vocabulary).

One file per model and reader: named by the GGUF's content hash and by a hash of the reader's own source
(gguf.py, quantized_weight.py) with CACHE_VERSION, so a changed file, a changed reader or a changed layout
never reads a stale entry. Written and read through llmopt/load_cache.py: two servers starting at once
both write whole files and either one's rename wins; a file that fails to load is parsed again and
rewritten."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import load_file, save

from llmopt.checkpoints import cache_dir, file_digest
from llmopt.engine.formats import gguf as gguf_reader
from llmopt.engine.formats import quantized_weight
from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.load_cache import load_or_build

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
    return load_or_build(
        cache_path(path, num_heads, num_kv_heads),
        lambda: gguf_reader.read_gguf(path, num_heads, num_kv_heads),
        load_entry,
        write_entry,
    )


def write_entry(parsed: Parsed, file: BinaryIO) -> None:
    dense, quantized = parsed
    tensors = {f"dense/{name}": t.contiguous() for name, t in dense.items()}
    shapes = {}
    for prefix, w in quantized.items():
        tensors |= {f"quantized/{prefix}/{k}": getattr(w, k).contiguous() for k in ("q", "scale", "zero")}
        shapes[prefix] = [w.bits, w.group_size]
    file.write(save(tensors, metadata={"quantized": json.dumps(shapes)}))


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
