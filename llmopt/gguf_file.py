"""A GGUF file's header (metadata and tensor table) read straight from the file, and its tensors' raw
bytes read one at a time.

The `gguf` package's GGUFReader parses every metadata array element by element into numpy views: 7.1 s
for Qwen2.5-Coder-1.5B's 151,936 tokens and 151,387 merges here (8.5 s for the 0.5B), before a single
weight is read. This reader walks the same layout with `struct` over a memory map, keeps the two big
string arrays only when asked (0.04 s without them, 0.5 s with them), and checks before anything is
allocated that every tensor lies inside the file: a truncated download is an error naming the file,
not a crash halfway through the load.

Tensor data is read with `readinto` into fresh buffers rather than mapped, so that the file's pages do
not stay in the process's resident memory beside the repacked weights built from them."""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Metadata value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8"}
STRING, ARRAY = 8, 9
# The string arrays a tokenizer needs in full; others are read only as their length.
VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


class GGUFError(ValueError):
    """A file that is not a readable GGUF model; the message names the file and what to do."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: rows first (GGUF lists the innermost dimension first)
    type: GGMLQuantizationType
    offset: int  # from the start of the file
    nbytes: int


@dataclass
class GGUFFile:
    path: Path
    metadata: dict  # values; a string array not asked for holds its length
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def get(self, key: str, default=None):
        """An architecture key ("block_count" is "{arch}.block_count") or a full one."""
        return self.metadata.get(f"{self.architecture}.{key}", self.metadata.get(key, default))

    def read(self, name: str) -> np.ndarray:
        """The tensor's raw bytes as uint8 [rows, bytes a row] (a 1-D tensor is one row)."""
        info = self.tensors[name]
        buffer = np.empty(info.nbytes, dtype=np.uint8)
        with self.path.open("rb") as f:
            f.seek(info.offset)
            if f.readinto(memoryview(buffer)) != info.nbytes:
                raise GGUFError(
                    f"{self.path}: the file ended inside tensor {name} (it changed while loading?)"
                )
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return buffer.reshape(rows, -1)


def read_gguf_file(path: Path, string_arrays: tuple[str, ...] = ()) -> GGUFFile:
    """The header of the GGUF at `path`; the arrays named in `string_arrays` are read in full. Without
    them, read once per process for a path, size and modification time: a start reads the header for
    the model check, the config and the weights."""
    path = Path(path).resolve()
    if string_arrays:
        return read_header(path, string_arrays)
    stat = path.stat()
    return read_header_once(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def read_header_once(path: Path, size: int, mtime_ns: int) -> GGUFFile:
    return read_header(path, ())


def read_header(path: Path, string_arrays: tuple[str, ...]) -> GGUFFile:
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return parse(path, view, string_arrays)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise GGUFError(
            f"{path}: the GGUF header is cut short or corrupted ({exc}); download it again"
        ) from None
    except ValueError as exc:  # mmap of an empty file
        if isinstance(exc, GGUFError):
            raise
        raise GGUFError(f"{path}: not a GGUF file ({exc})") from None


def parse(path: Path, view: mmap.mmap, string_arrays: tuple[str, ...]) -> GGUFFile:
    if view[:4] != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", view, 4)
    if version not in VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version}; llmopt reads versions 2 and 3")
    metadata, pos = {}, 24
    for _ in range(kv_count):
        key, pos = read_string(view, pos)
        (value_type,) = struct.unpack_from("<I", view, pos)
        metadata[key], pos = read_value(view, pos + 4, value_type, key in string_arrays)
    if "general.architecture" not in metadata:
        raise GGUFError(f"{path}: no general.architecture in its metadata")
    entries = []
    for _ in range(tensor_count):
        name, pos = read_string(view, pos)
        (dims,) = struct.unpack_from("<I", view, pos)
        shape = struct.unpack_from(f"<{dims}Q", view, pos + 4)
        type_id, offset = struct.unpack_from("<IQ", view, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        entries.append((name, tuple(reversed(shape)), type_id, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-pos // alignment) * alignment
    tensors = {name: tensor_info(path, name, shape, t, data_start + o) for name, shape, t, o in entries}
    check_inside(path, tensors, len(view))
    return GGUFFile(path, metadata, tensors)


def tensor_info(path: Path, name: str, shape: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(type_id)
        block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise GGUFError(
            f"{path}: tensor {name} has ggml type {type_id}, which llmopt does not know"
        ) from None
    values = int(np.prod(shape))
    if values % block_values:
        raise GGUFError(f"{path}: tensor {name} {shape} is not whole {qtype.name} blocks of {block_values}")
    return TensorInfo(name, shape, qtype, offset, values // block_values * block_bytes)


def check_inside(path: Path, tensors: dict[str, TensorInfo], size: int) -> None:
    end = max((t.offset + t.nbytes for t in tensors.values()), default=0)
    if end > size:
        last = max(tensors.values(), key=lambda t: t.offset + t.nbytes)
        raise GGUFError(
            f"{path}: truncated: tensor {last.name} ends at byte {end:,} but the file has {size:,} bytes "
            "(an incomplete download or copy?); download it again"
        )


def read_string(view: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", view, pos)
    end = pos + 8 + length
    if end > len(view):
        raise IndexError("a string runs past the end of the file")
    return view[pos + 8 : end].decode("utf-8"), end


def read_value(view: mmap.mmap, pos: int, value_type: int, keep_strings: bool):
    """One metadata value and the position after it."""
    if value_type in SCALARS:
        (value,) = struct.unpack_from(SCALARS[value_type], view, pos)
        return value, pos + struct.calcsize(SCALARS[value_type])
    if value_type == STRING:
        return read_string(view, pos)
    if value_type != ARRAY:
        raise GGUFError(f"metadata value of unknown type {value_type}")
    element_type, count = struct.unpack_from("<IQ", view, pos)
    pos += 12
    if element_type in NUMPY:  # token types, scores: numbers, read at once
        values = np.frombuffer(view, NUMPY[element_type], count, pos).copy()
        return values, pos + values.nbytes
    if element_type != STRING:
        raise GGUFError(f"metadata array of unsupported element type {element_type}")
    if keep_strings:
        strings = []
        for _ in range(count):
            value, pos = read_string(view, pos)
            strings.append(value)
        return strings, pos
    for _ in range(count):  # a vocabulary nobody asked for: walk past it
        (length,) = struct.unpack_from("<Q", view, pos)
        pos += 8 + length
    return count, pos
