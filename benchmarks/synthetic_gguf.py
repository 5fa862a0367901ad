"""A GGUF of a real model's shapes with random weights, written by the `gguf` package one tensor at a time
(a 7B file never sits in memory), for what does not depend on the weights' values: start-up time, peak
resident memory, disk used, and the speed of a decode step, here and in llama.cpp on the same file.

Shapes and the Q4_K_M type mix follow llama.cpp's quantizer: Q4_K everywhere except attn_v and ffn_down
in the first and last eighth of the layers and every third layer between (Q6_K), and a Q6_K output
layer; norms and biases in F32. Random bytes are valid K-quant blocks once their fp16 scale fields are
finite. The tokenizer, chat template and special tokens are copied from a real file of the family
(the 0.5B Qwen2.5-Coder, or the bundled SmolLM2 for Llama shapes), so the server starts as it would.

    python benchmarks/synthetic_gguf.py qwen2.5-7b OUT.gguf
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from llmopt.gguf_file import VOCABULARY_KEYS, read_gguf_file

# Where each K-quant block keeps its fp16 fields (d, then dmin where it has one).
HALVES = {T.Q4_K: (0, 2), T.Q6_K: (208, 1)}


@dataclass(frozen=True)
class Shape:
    architecture: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    rope_base: float
    bias: bool  # Qwen2's q/k/v biases


SHAPES = {
    # Qwen2.5-7B pads its embedding to 152,064 rows; llama.cpp wants one row a token of the vocabulary
    # copied here, so this file has 151,936.
    "qwen2.5-7b": Shape("qwen2", 28, 3584, 18944, 28, 4, 151936, 1_000_000.0, True),
    "qwen2.5-1.5b": Shape("qwen2", 28, 1536, 8960, 12, 2, 151936, 1_000_000.0, True),
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 4864, 14, 2, 151936, 1_000_000.0, True),
    "llama-3-8b": Shape("llama", 32, 4096, 14336, 32, 8, 128256, 500_000.0, False),
}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: where Q4_K_M gives attn_v and ffn_down Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensors(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int], T]]:
    """(GGUF name, (rows, columns) or (length,), type) of every tensor, in llama.cpp's order."""
    head_dim = shape.hidden // shape.heads
    q, kv = shape.heads * head_dim, shape.kv_heads * head_dim
    found: list = [("token_embd.weight", (shape.vocab, shape.hidden), T.Q4_K)]
    for i in range(shape.layers):
        wide = T.Q6_K if more_bits(i, shape.layers) else T.Q4_K
        blk = f"blk.{i}."
        found += [
            (blk + "attn_norm.weight", (shape.hidden,), T.F32),
            (blk + "attn_q.weight", (q, shape.hidden), T.Q4_K),
            (blk + "attn_k.weight", (kv, shape.hidden), T.Q4_K),
            (blk + "attn_v.weight", (kv, shape.hidden), wide),
            (blk + "attn_output.weight", (shape.hidden, q), T.Q4_K),
            (blk + "ffn_norm.weight", (shape.hidden,), T.F32),
            (blk + "ffn_gate.weight", (shape.ffn, shape.hidden), T.Q4_K),
            (blk + "ffn_up.weight", (shape.ffn, shape.hidden), T.Q4_K),
            (blk + "ffn_down.weight", (shape.hidden, shape.ffn), wide),
        ]
        if shape.bias:
            found += [(blk + f"attn_{p}.bias", (n,), T.F32) for p, n in (("q", q), ("k", kv), ("v", kv))]
    return found + [
        ("output_norm.weight", (shape.hidden,), T.F32),
        ("output.weight", (shape.vocab, shape.hidden), T.Q6_K),
    ]


def byte_shape(dims: tuple[int, ...], qtype: T) -> tuple[int, ...]:
    if qtype == T.F32:
        return dims
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    return (*dims[:-1], dims[-1] // values * size)


def random_rows(rng: np.random.Generator, dims: tuple[int, ...], qtype: T) -> np.ndarray:
    if qtype == T.F32:  # norms near 1, biases near 0: finite activations through the layers
        return (1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32)
    rows = rng.integers(0, 256, byte_shape(dims, qtype), dtype=np.uint8)
    block = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rows.reshape(-1, block)
    start, fields = HALVES[qtype]
    scales = rng.uniform(1e-4, 2e-3, (len(blocks), fields)).astype(np.float16)
    blocks[:, start : start + 2 * fields] = scales.view(np.uint8)
    return rows


def tokenizer_source(shape: Shape) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    if shape.architecture == "qwen2":
        from real_models import assemble

        return assemble("qwen2.5-coder-0.5b")
    from llmopt.checkpoints import bundled_gguf_path

    return bundled_gguf_path()


def add_metadata(writer: gguf.GGUFWriter, shape: Shape) -> None:
    writer.add_block_count(shape.layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M
    source = read_gguf_file(tokenizer_source(shape), VOCABULARY_KEYS).metadata
    for key, value in source.items():
        if key.startswith("tokenizer."):
            add_copied(writer, key, value)


def add_copied(writer: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, np.ndarray):
        kind = gguf.GGUFValueType.FLOAT32 if value.dtype == np.float32 else gguf.GGUFValueType.INT32
        writer.add_key_value(key, value.tolist(), gguf.GGUFValueType.ARRAY, sub_type=kind)
    elif isinstance(value, list):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    else:
        writer.add_string(key, str(value))


def write(name: str, path: Path, seed: int = 0) -> Path:
    """The synthetic file `name` (a key of SHAPES) at `path`."""
    shape = SHAPES[name]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), shape.architecture)
    add_metadata(writer, shape)
    plan = tensors(shape)
    for tensor_name, dims, qtype in plan:
        data_shape = byte_shape(dims, qtype)
        dtype = np.float32 if qtype == T.F32 else np.uint8
        nbytes = int(np.prod(data_shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(
            tensor_name, data_shape, np.dtype(dtype), nbytes, None if qtype == T.F32 else qtype
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, dims, qtype in plan:  # one tensor at a time, streamed in row chunks
        writer.write_tensor_data(random_rows(rng, dims, qtype))
    writer.close()
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        raise SystemExit(f"usage: python benchmarks/synthetic_gguf.py {{{','.join(SHAPES)}}} OUT.gguf")
    print(write(sys.argv[1], Path(sys.argv[2])))
