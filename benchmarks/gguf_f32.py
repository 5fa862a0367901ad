"""Write an F32 copy of a GGUF file (same metadata, every tensor dequantized), so that llama.cpp can
be measured on exactly the fp32 weights llmopt serves, next to its own quantized format.

    .venv/bin/python benchmarks/gguf_f32.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize


def write_f32_copy(src: Path, dst: Path) -> Path:
    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for tensor in reader.tensors:
        data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        shape = tuple(reversed([int(d) for d in tensor.shape]))  # GGUF lists ne0 first
        writer.add_tensor(tensor.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="the GGUF file to copy")
    ap.add_argument("dst", type=Path, help="where the F32 copy goes (kept as it is when it exists)")
    args = ap.parse_args()
    print(write_f32_copy(args.src, args.dst))


if __name__ == "__main__":
    main()
