"""GGUF tensors read natively, one at a time from the file: the blocks of every quantized type a
Q2_K ... Q8_0 file holds brought into the canonical QuantizedWeight (w = (q - zero) * scale per group)
exactly, vectorised over the blocks, with the tensors renamed to the Hugging Face names the loader takes
(Llama's layout, or Gemma 3's). Norms, biases and F32/F16 tensors are read as fp32; a linear of a type
with no exact canonical form (the IQ and TQ types) is dequantized by the `gguf` package and requantized
once to int8 in groups of 32, the nearest kernel format, and the start-up log says so.

Nothing is read until the loader takes a tensor, and what it takes is read into its own buffer, so the
load holds the engine's form of the model plus one tensor in flight, never an fp32 copy of the whole."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import Q4_K, dequantize, quantize

from llmopt.engine.formats.quantized_weight import QuantizedWeight
from llmopt.gguf_file import GGUFError, GGUFFile, TensorInfo
from llmopt.gguf_names import GEMMA3_LAYER_NAMES, GLOBAL_NAMES, LAYER_NAMES

log = logging.getLogger(__name__)

T = GGMLQuantizationType
DENSE_TYPES = (T.F32, T.F16, T.BF16)
# Per architecture, llama.cpp's layer tensor names -> the HF ones (Gemma 3: four norms a layer).
ARCHITECTURE_NAMES = {"gemma3": GEMMA3_LAYER_NAMES}
# llama.cpp's converter interleaves the rows of q and k of these architectures for its rope layout.
PERMUTED_ARCHITECTURES = ("llama",)
# Tensors the engine derives itself (llama 3's rope frequencies are read into the config instead).
SKIPPED = ("rope_freqs",)
# Rows converted at a time: the unpacked values of a 151,936-row output layer at once would be 1 GB of
# temporaries beside the model.
CHUNK_ROWS = 8192

Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # q [n, values], scale [n, groups], zero [n, groups]


def half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte `start` of every block, as float32 [n, 1]."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def nibbles(packed: np.ndarray, run: int) -> np.ndarray:
    """[n, bytes] -> [n, 2 * bytes]: within every `run` bytes, the low nibbles then the high ones."""
    n = packed.shape[0]
    split = packed.reshape(n, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (split & 15).reshape(n, -1)


def crumbs(packed: np.ndarray, run: int) -> np.ndarray:
    """[n, bytes] -> [n, 4 * bytes] of 2-bit values: within every `run` bytes, bits 0-1, then 2-3, ..."""
    n = packed.shape[0]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((packed.reshape(n, -1, 1, run) >> shifts) & 3).reshape(n, -1)


def bit_planes(packed: np.ndarray, planes: int) -> np.ndarray:
    """[n, bytes] -> [n, planes * bytes]: value j * bytes + k is bit j of byte k (K-quants' high bits)."""
    n = packed.shape[0]
    shifts = np.arange(planes, dtype=np.uint8).reshape(1, planes, 1)
    return ((packed.reshape(n, 1, -1) >> shifts) & 1).reshape(n, -1)


def offset_form(q: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> Blocks:
    """w = scale * q - offset as (q, scale, zero = offset / scale). A group whose scale is 0 holds
    -offset in every position whatever its q: written as q = 0, zero = -1, scale = -offset, which the
    canonical form represents exactly."""
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(scale == 0, 0.0, offset / scale).astype(np.float32)
    flat = scale == 0
    group = q.shape[1] // scale.shape[1]
    q.reshape(q.shape[0], scale.shape[1], group)[flat] = 0
    zero[flat] = -1.0
    scale = np.where(flat, -offset, scale).astype(np.float32)
    return q, scale, zero


def symmetric(blocks: np.ndarray, zero: float, groups: int = 1) -> np.ndarray:
    return np.full((len(blocks), groups), zero, np.float32)


def q4_0(blocks: np.ndarray) -> Blocks:  # w = d * (q - 8)
    return nibbles(blocks[:, 2:], 16), half(blocks, 0), symmetric(blocks, 8.0)


def q4_1(blocks: np.ndarray) -> Blocks:  # w = d * q + m
    return offset_form(nibbles(blocks[:, 4:], 16), half(blocks, 0), -half(blocks, 2))


def fifth_bits(blocks: np.ndarray, start: int) -> np.ndarray:
    """Q5_0 / Q5_1's 32-bit qh at byte `start`: bit j is the fifth bit of value j."""
    return np.unpackbits(blocks[:, start : start + 4], axis=1, bitorder="little")


def q5_0(blocks: np.ndarray) -> Blocks:
    """w = d * (q - 16) with 5-bit q. No kernel takes 5 bits, so the values are widened, exactly, to the
    int8 layout: symmetric, stored q - 16 + 128 around zero point 128, as Q8_0 (llama.cpp's Q5_0 dot
    product is the same sum)."""
    q = nibbles(blocks[:, 6:], 16) | (fifth_bits(blocks, 2) << 4)
    return q + np.uint8(112), half(blocks, 0), symmetric(blocks, 128.0)


def q5_1(blocks: np.ndarray) -> Blocks:  # w = d * q + m with 5-bit q, widened to 8 bits
    q = nibbles(blocks[:, 8:], 16) | (fifth_bits(blocks, 4) << 4)
    return offset_form(q, half(blocks, 0), -half(blocks, 2))


def q8_0(blocks: np.ndarray) -> Blocks:  # w = d * q, q signed: stored unsigned as q + 128
    q = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return q, half(blocks, 0), symmetric(blocks, 128.0)


def k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's scale and offset per sub-block of 32: d * sc_j and dmin * m_j (6-bit sc, m)."""
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16])
    return half(blocks, 0) * sc.astype(np.float32), half(blocks, 2) * mn.astype(np.float32)


def q4_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: w = d * sc_j * q - dmin * m_j per sub-block j of 32: a group of 32."""
    return offset_form(nibbles(blocks[:, 16:], 32), *k_scales(blocks))


def q5_k(blocks: np.ndarray) -> Blocks:  # Q4_K's form with a fifth bit plane (qh): widened to 8 bits
    q = nibbles(blocks[:, 48:], 32) | (bit_planes(blocks[:, 16:48], 8) << 4)
    return offset_form(q, *k_scales(blocks))


def q6_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: 6-bit q (low 4 bits in ql, high 2 in qh) with zero 32 and an int8 sub-scale
    per 16 values: a group of 16 with scale d * sc_j."""
    q = nibbles(blocks[:, :128], 64) | (crumbs(blocks[:, 128:192], 32) << 4)
    scale = half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return q, scale, symmetric(blocks, 32.0, 16)


def q3_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: 3-bit q (2 low bits in qs, the third in hmask) with zero 4 and a 6-bit
    signed sub-scale per 16 values: a group of 16 with scale d * (sc_j - 32), in 4-bit storage."""
    q = crumbs(blocks[:, 32:96], 32) | (bit_planes(blocks[:, :32], 8) << 2)
    low = nibbles(blocks[:, 96:104], 8)  # sub-scales 0-7 low nibbles, then 8-15
    high = crumbs(blocks[:, 104:108], 4)
    sc = (low | (high << 4)).astype(np.float32) - 32
    return q, half(blocks, 108) * sc, symmetric(blocks, 4.0, 16)


def q2_k(blocks: np.ndarray) -> Blocks:
    """Super-blocks of 256: 2-bit q, a 4-bit scale and offset per 16 values: groups of 16, 4-bit storage."""
    sc = blocks[:, :16]
    scale = half(blocks, 80) * (sc & 15).astype(np.float32)
    offset = half(blocks, 82) * (sc >> 4).astype(np.float32)
    return offset_form(crumbs(blocks[:, 16:80], 32), scale, offset)


@dataclass(frozen=True)
class Native:
    read: Callable[[np.ndarray], Blocks]
    bits: int  # canonical storage: 4, or up to 8 held in int8 (6 for Q6_K, whose values need 6)
    block_values: int
    group: int


NATIVE: dict[GGMLQuantizationType, Native] = {
    T.Q4_0: Native(q4_0, 4, 32, 32),
    T.Q4_1: Native(q4_1, 4, 32, 32),
    T.Q5_0: Native(q5_0, 8, 32, 32),
    T.Q5_1: Native(q5_1, 8, 32, 32),
    T.Q8_0: Native(q8_0, 8, 32, 32),
    T.Q2_K: Native(q2_k, 4, 256, 16),
    T.Q3_K: Native(q3_k, 4, 256, 16),
    T.Q4_K: Native(q4_k, 4, 256, 32),
    T.Q5_K: Native(q5_k, 8, 256, 32),
    T.Q6_K: Native(q6_k, 6, 256, 16),
}
REQUANTIZED_GROUP = 32  # the int8 groups a type without a canonical form is requantized to
# Types on a finer grid than Q4_0's: what a draft model's linears are requantized from (a draft step is a
# read of its weights: the 0.5B Qwen2.5-Coder's Q5_0 layers and Q8_0 tied head are 394 MB a step, as Q4_0
# 279 MB). Not Q4_1: another 4-bit grid, rounded twice, for 10 % fewer bytes, parted the bundled 135M's
# teacher-forced greedy tokens from its fp32 copy's on 31 % of positions, against 5 % as the file is.
FINER_THAN_Q4_0 = (T.Q5_0, T.Q5_1, T.Q8_0, T.Q5_K, T.Q6_K)


@dataclass
class GGUFBlocks:
    """A linear's raw blocks as the file holds them: uint8 [rows, bytes a row], of a NATIVE type. The GGUF
    kernel runs them as they are (layers/gguf_panels.py); `canonical()` is the generic form."""

    data: np.ndarray
    type: GGMLQuantizationType
    in_features: int

    def canonical(self) -> QuantizedWeight:
        return to_quantized(self.data, self.type, self.in_features)


def as_q4_0(blocks: GGUFBlocks, name: str) -> GGUFBlocks:
    """The blocks dequantized and quantized again as Q4_0 (llama.cpp's reference rounding, as the `gguf`
    package has it), CHUNK_ROWS rows at a time."""
    data = blocks.data
    parts = [
        quantize(
            rows_dequantized(np.ascontiguousarray(data[i : i + CHUNK_ROWS]), blocks.type, name).numpy(),
            T.Q4_0,
        )
        for i in range(0, data.shape[0], CHUNK_ROWS)
    ]
    return GGUFBlocks(np.concatenate(parts), T.Q4_0, blocks.in_features)


def to_quantized(data: np.ndarray, qtype: GGMLQuantizationType, in_features: int) -> QuantizedWeight:
    """A 2-D tensor's raw blocks (uint8 [out, bytes a row]) in canonical form: q [out, in], scale and
    zero [out, in / group], converted CHUNK_ROWS rows at a time."""
    native = NATIVE[qtype]
    out_features = data.shape[0]
    assert in_features % native.block_values == 0, (qtype.name, in_features)
    groups = in_features // native.group
    q = torch.empty(out_features, in_features, dtype=torch.uint8)
    scale = torch.empty(out_features, groups)
    zero = torch.empty(out_features, groups)
    for start in range(0, out_features, CHUNK_ROWS):
        rows = slice(start, min(start + CHUNK_ROWS, out_features))
        part = np.ascontiguousarray(data[rows])
        bq, bs, bz = native.read(part.reshape(-1, part.shape[1] * native.block_values // in_features))
        q[rows] = torch.from_numpy(np.ascontiguousarray(bq).reshape(-1, in_features))
        scale[rows] = torch.from_numpy(np.ascontiguousarray(bs, np.float32).reshape(-1, groups))
        zero[rows] = torch.from_numpy(np.ascontiguousarray(bz, np.float32).reshape(-1, groups))
    return QuantizedWeight(q, scale, zero, native.bits, native.group)


def dequantized(data: np.ndarray, info: TensorInfo) -> torch.Tensor:
    """fp32 of any type the `gguf` package reads, in the tensor's shape."""
    return rows_dequantized(data, info.type, info.name).reshape(info.shape)


def rows_dequantized(data: np.ndarray, qtype: GGMLQuantizationType, name: str) -> torch.Tensor:
    """[rows, bytes a row] of blocks -> fp32 [rows, values a row]."""
    if qtype == T.F32:
        return torch.from_numpy(data.view(np.float32).copy())
    try:
        values = dequantize(data, qtype)
    except NotImplementedError:
        raise GGUFError(f"tensor {name} is of type {qtype.name}, which llmopt cannot read") from None
    return torch.from_numpy(np.asarray(values, np.float32).reshape(data.shape[0], -1))


def requantized(data: np.ndarray, info: TensorInfo) -> QuantizedWeight:
    """A linear of a type with no canonical form, dequantized then stored as int8 in groups of 32 (the
    symmetric form Q8_0 has), a block of rows at a time."""
    out_features, in_features = info.shape
    group = REQUANTIZED_GROUP if in_features % REQUANTIZED_GROUP == 0 else in_features
    q = torch.empty(out_features, in_features, dtype=torch.uint8)
    scale = torch.empty(out_features, in_features // group)
    for start in range(0, out_features, CHUNK_ROWS):
        rows = slice(start, min(start + CHUNK_ROWS, out_features))
        blocks = rows_dequantized(np.ascontiguousarray(data[rows]), info.type, info.name)
        blocks = blocks.view(-1, in_features // group, group)
        scale[rows] = blocks.abs().amax(2).clamp_(min=torch.finfo(torch.float32).tiny) / 127
        values = torch.div(blocks, scale[rows][..., None]).round_().clamp_(-127, 127).add_(128)
        q[rows] = values.to(torch.uint8).view(-1, in_features)
    return QuantizedWeight(q, scale, torch.full_like(scale, 128.0), 8, group)


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
    raise GGUFError(f"GGUF tensor {name!r} has no counterpart in llmopt's model")


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (transformers' _reverse_permute_weights): the
    file holds, per head, the rows of the two rotary halves interleaved."""
    dim = rows // heads // 2
    return torch.from_numpy(np.arange(rows).reshape(heads, dim, 2).swapaxes(1, 2).reshape(-1).copy())


def take_rows(value: torch.Tensor | QuantizedWeight | GGUFBlocks, order: torch.Tensor):
    if isinstance(value, GGUFBlocks):
        return GGUFBlocks(value.data[order.numpy()], value.type, value.in_features)
    if isinstance(value, QuantizedWeight):
        return QuantizedWeight(
            value.q[order], value.scale[order], value.zero[order], value.bits, value.group_size
        )
    return value[order]


def is_linear(name: str) -> bool:
    return name.endswith("_proj.weight") or name == "lm_head.weight"


class GGUFTensors:
    """A GGUF file's tensors by HF name, each read from the file when the loader takes it. With
    `native`, linear layers (and the output layer) come as QuantizedWeight, the token embedding as the
    file's raw blocks; without, everything is fp32 (`--dtype float32`, dequantized tensor by tensor).
    With `q4_0`, linears of a type FINER_THAN_Q4_0 come requantized to Q4_0 (a draft model's)."""

    def __init__(self, gguf: GGUFFile, num_heads: int, num_kv_heads: int, native: bool, q4_0: bool = False):
        self.gguf, self.native, self.q4_0 = gguf, native, q4_0
        self.architecture = gguf.architecture
        layer_names = ARCHITECTURE_NAMES.get(self.architecture, LAYER_NAMES)
        self.infos: dict[str, TensorInfo] = {}
        for info in gguf.tensors.values():
            name = hf_name(info.name, layer_names)
            if name is not None:
                self.infos[name] = info
        self.heads = {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv_heads}
        self.requantized: Counter[str] = Counter()
        self.narrowed: Counter[str] = Counter()

    def names(self) -> Iterator[str]:
        return iter(list(self.infos))

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def quantized_linear(self, name: str) -> bool:
        """Whether `name` (an HF weight name) is taken as a QuantizedWeight."""
        info = self.infos.get(name)
        return self.native and info is not None and is_linear(name) and info.type not in DENSE_TYPES

    def take(self, name: str) -> torch.Tensor | QuantizedWeight | GGUFBlocks:
        """The tensor, read now: a quantized linear as its blocks (or, for a type with no exact form, a
        requantized QuantizedWeight), anything else as fp32."""
        quantized = self.quantized_linear(name)
        info = self.infos.pop(name)
        data = self.gguf.read(info.name)
        value = self.quantized(data, info) if quantized else dequantized(data, info)
        head_count = next((h for key, h in self.heads.items() if f".{key}." in name), None)
        if self.architecture in PERMUTED_ARCHITECTURES and head_count:
            value = take_rows(value, unpermute_rows(info.shape[0], head_count))
        if self.architecture == "gemma3" and name.endswith("norm.weight"):
            value = value - 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        return value

    def quantized(self, data: np.ndarray, info: TensorInfo) -> GGUFBlocks | QuantizedWeight:
        if self.q4_0 and info.type in FINER_THAN_Q4_0:
            self.narrowed[info.type.name] += 1
            return as_q4_0(GGUFBlocks(data, info.type, info.shape[1]), info.name)
        if info.type in NATIVE:
            return GGUFBlocks(data, info.type, info.shape[1])
        self.requantized[info.type.name] += 1
        return requantized(data, info)

    def raw_blocks(self, name: str) -> tuple[torch.Tensor, GGMLQuantizationType]:
        """The tensor's bytes as the file holds them (uint8 [rows, bytes a row]) and their type."""
        info = self.infos.pop(name)
        return torch.from_numpy(self.gguf.read(info.name)), info.type

    def tied_head(self) -> GGUFBlocks | QuantizedWeight | None:
        """The quantized token embedding as the output layer's weight (llama.cpp multiplies by the
        file's own embedding blocks when the model ties them), whether or not the embedding was taken;
        None when not `native` or the embedding is stored dense."""
        info = self.gguf.tensors["token_embd.weight"]
        if not self.native or info.type in DENSE_TYPES:
            return None
        return self.quantized(self.gguf.read(info.name), info)

    def log_conversions(self) -> None:
        if self.requantized:
            log.warning(
                "%s: GGUF types %s have no exact kernel form here; those layers were requantized once to "
                "int8 in groups of %d",
                self.gguf.path.name,
                ", ".join(f"{t} ({n} tensors)" for t, n in sorted(self.requantized.items())),
                REQUANTIZED_GROUP,
            )
        if self.narrowed:
            log.info(
                "%s: %s linears requantized to Q4_0, as a draft model reads them",
                self.gguf.path.name,
                ", ".join(f"{n} {t}" for t, n in sorted(self.narrowed.items())),
            )
