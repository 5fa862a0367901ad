"""GGUF files read natively: the blocks of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K tensors brought into
the canonical QuantizedWeight (w = (q - zero) * scale per group), vectorised over all blocks at once, with
the tensors renamed to the Hugging Face names the loader takes (Llama's layout, or Gemma 3's). Every
other tensor (F32/F16 norms and embeddings, quant types without a clean mapping) is dequantized by the
`gguf` package."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import Q4_K, dequantize

from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.gguf_names import GEMMA3_LAYER_NAMES, GLOBAL_NAMES, LAYER_NAMES

log = logging.getLogger(__name__)

T = GGMLQuantizationType
DENSE_TYPES = (T.F32, T.F16, T.BF16)
# The model types whose GGUF layout read_gguf maps (MoE experts it does not).
NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
# Per architecture, llama.cpp's layer tensor names -> the HF ones (Gemma 3: four norms a layer).
ARCHITECTURE_NAMES = {"gemma3": GEMMA3_LAYER_NAMES}
# llama.cpp's converter interleaves the rows of q and k of these architectures for its rope layout.
PERMUTED_ARCHITECTURES = ("llama",)
# Tensors the engine derives itself (llama 3's precomputed rope frequencies).
SKIPPED = ("rope_freqs",)

Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # q [n, values], scale [n, groups], zero [n, groups]


def half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte `start` of every block, as float32 [n, 1]."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def nibbles(packed: np.ndarray, run: int) -> np.ndarray:
    """[n, bytes] -> [n, 2 * bytes]: within every `run` bytes, the low nibbles then the high ones."""
    n = packed.shape[0]
    split = packed.reshape(n, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (split & 15).reshape(n, -1)


def constant_where_flat(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, value: np.ndarray) -> None:
    """A group whose scale is 0 holds `value` in every position whatever its q: written as q = 0,
    zero = -1, scale = value, which the canonical form represents exactly."""
    flat = scale == 0
    group = q.shape[1] // scale.shape[1]
    q.reshape(q.shape[0], scale.shape[1], group)[flat] = 0
    zero[flat] = -1.0
    scale[flat] = value[flat]


def q4_0(blocks: np.ndarray) -> Blocks:  # w = d * (q - 8)
    return nibbles(blocks[:, 2:], 16), half(blocks, 0), np.full((len(blocks), 1), 8.0, np.float32)


def q4_1(blocks: np.ndarray) -> Blocks:  # w = d * q + m
    d, m = half(blocks, 0), half(blocks, 2)
    q = nibbles(blocks[:, 4:], 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(d == 0, 0.0, -m / d).astype(np.float32)
    constant_where_flat(q, d, zero, m)
    return q, d, zero


def q5_0(blocks: np.ndarray) -> Blocks:
    """w = d * (q - 16) with 5-bit q: low nibbles as Q4_0's, bit j of the 32-bit qh the fifth bit of
    value j. No kernel takes 5 bits, so the values are widened, exactly, to the int8 layout: symmetric,
    stored q - 16 + 128 around zero point 128, as Q8_0 (llama.cpp's Q5_0 dot product is the same sum)."""
    fifth = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")
    q = nibbles(blocks[:, 6:], 16) | (fifth << 4)
    return q + np.uint8(112), half(blocks, 0), np.full((len(blocks), 1), 128.0, np.float32)


def q8_0(blocks: np.ndarray) -> Blocks:  # w = d * q, q signed: stored unsigned as q + 128
    q = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return q, half(blocks, 0), np.full((len(blocks), 1), 128.0, np.float32)


def q4_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: w = d * sc_j * q - dmin * m_j with 6-bit sc_j, m_j per sub-block j of 32, so
    each sub-block is a group of 32 with scale d * sc_j and zero dmin * m_j / scale."""
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16])
    scale = half(blocks, 0) * sc.astype(np.float32)
    offset = half(blocks, 2) * mn.astype(np.float32)
    q = nibbles(blocks[:, 16:], 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(scale == 0, 0.0, offset / scale).astype(np.float32)
    constant_where_flat(q, scale, zero, -offset)
    return q, scale, zero


def q6_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: 6-bit q (low 4 bits in ql, high 2 in qh) with zero 32 and an int8 sub-scale
    per 16 values: a group of 16 with scale d * sc_j."""
    n = len(blocks)
    low = nibbles(blocks[:, :128], 64)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 256)
    q = low | (high << 4)
    scale = half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return q, scale, np.full((n, 16), 32.0, np.float32)


# type: (reader, bits, values per block, values per group)
NATIVE: dict[GGMLQuantizationType, tuple[Callable[[np.ndarray], Blocks], int, int, int]] = {
    T.Q4_0: (q4_0, 4, 32, 32),
    T.Q4_1: (q4_1, 4, 32, 32),
    T.Q5_0: (q5_0, 8, 32, 32),
    T.Q8_0: (q8_0, 8, 32, 32),
    T.Q4_K: (q4_k, 4, 256, 32),
    T.Q6_K: (q6_k, 6, 256, 16),
}


def to_quantized(data: np.ndarray, qtype: GGMLQuantizationType, in_features: int) -> QuantizedWeight:
    """A 2-D tensor's raw blocks (uint8 [out, bytes per row], as GGUFReader gives them) in canonical
    form: q [out, in], scale and zero [out, in / group]."""
    read, bits, block_values, group = NATIVE[qtype]
    out_features = data.shape[0]
    assert in_features % block_values == 0, (qtype.name, in_features)
    blocks = np.ascontiguousarray(data).reshape(out_features * in_features // block_values, -1)
    q, scale, zero = read(blocks)
    groups = in_features // group
    return QuantizedWeight(
        torch.from_numpy(np.ascontiguousarray(q).reshape(out_features, in_features)),
        torch.from_numpy(np.ascontiguousarray(scale, np.float32).reshape(out_features, groups)),
        torch.from_numpy(np.ascontiguousarray(zero, np.float32).reshape(out_features, groups)),
        bits,
        group,
    )


def hf_name(name: str, layer_names: dict[str, str] = LAYER_NAMES) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for tensors we skip."""
    base, _, suffix = name.rpartition(".")
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    if any(s in name for s in SKIPPED):
        return None
    raise ValueError(f"GGUF tensor {name!r} has no counterpart in llmopt's model")


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (transformers' _reverse_permute_weights): the
    file holds, per head, the rows of the two rotary halves interleaved."""
    dim = rows // heads // 2
    return torch.from_numpy(np.arange(rows).reshape(heads, dim, 2).swapaxes(1, 2).reshape(-1).copy())


def take_rows(value: torch.Tensor | QuantizedWeight, order: torch.Tensor) -> torch.Tensor | QuantizedWeight:
    if isinstance(value, QuantizedWeight):
        return QuantizedWeight(
            value.q[order], value.scale[order], value.zero[order], value.bits, value.group_size
        )
    return value[order]


def read_tensor(tensor: ReaderTensor, name: str) -> torch.Tensor | QuantizedWeight:
    """A linear layer of a native type in canonical form; anything else dequantized to fp32."""
    qtype = tensor.tensor_type
    if (name.endswith("_proj.weight") or name == "lm_head.weight") and qtype in NATIVE:
        return to_quantized(tensor.data, qtype, int(tensor.shape[0]))
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return torch.from_numpy(np.array(dequantize(tensor.data, qtype), np.float32).reshape(shape))


def read_gguf(
    path: Path, num_heads: int, num_kv_heads: int
) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """(dense fp32 tensors, quantized linear weights by layer prefix) of a GGUF file, in HF names.
    Only linear layers stay quantized: embeddings and norms are read as fp32. Gemma 3's norms come back
    as its checkpoints hold them (llama.cpp's converter added 1 to each), and its tied output layer as
    the file's quantized embedding, which is what llama.cpp multiplies by."""
    reader = GGUFReader(path)
    architecture = str(reader.fields["general.architecture"].contents())
    layer_names = ARCHITECTURE_NAMES.get(architecture, LAYER_NAMES)
    tied_head = architecture == "gemma3" and all(t.name != "output.weight" for t in reader.tensors)
    dense: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    fallback: Counter[str] = Counter()
    for tensor in reader.tensors:
        name = hf_name(tensor.name, layer_names)
        if name is None:
            continue
        qtype = tensor.tensor_type
        if qtype not in DENSE_TYPES and qtype not in NATIVE:
            fallback[qtype.name] += 1
        value = read_tensor(tensor, name)
        heads = {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv_heads}
        head_count = next((h for key, h in heads.items() if f".{key}." in name), None)
        if architecture in PERMUTED_ARCHITECTURES and head_count:
            rows = value.q.shape[0] if isinstance(value, QuantizedWeight) else value.shape[0]
            value = take_rows(value, unpermute_rows(rows, head_count))
        if isinstance(value, QuantizedWeight):
            quantized[name.removesuffix(".weight")] = value
        elif architecture == "gemma3" and name.endswith("norm.weight"):
            dense[name] = value.float() - 1.0
        else:
            dense[name] = value.float()
        if tied_head and tensor.name == "token_embd.weight" and qtype in NATIVE:
            quantized["lm_head"] = to_quantized(tensor.data, qtype, int(tensor.shape[0]))
    if fallback:
        log.warning(
            "%s: GGUF types %s are not served natively; those tensors run dequantized (fp32)",
            path.name,
            ", ".join(f"{t} ({n} tensors)" for t, n in sorted(fallback.items())),
        )
    return dense, quantized
