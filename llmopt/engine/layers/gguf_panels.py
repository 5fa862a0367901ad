"""GGUF blocks in the layout of the engine's GGUF kernel (kernels/gguf_matmul.cpp): 16 rows at a time,
the same bytes of each row side by side, every type at its own width. The values and scales are the
file's own bytes (K-quants' packed 6-bit sub-scales unpacked to a byte each), so the repack is a
transpose of 4-byte words, and a Q4_K_M model takes about its file's size in memory (Qwen2.5-Coder-1.5B:
1.07 GB for a 1.12 GB file, where the generic int4 / int8 panels took 2.4 GB).

A fused linear (q/k/v, gate/up) is its parts' panels one after another, each panel with its own type: a
Q4_K_M layer's Q6_K v beside Q4_K q and k runs each at its own width."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import Q4_K

from llmopt.engine import kernels
from llmopt.engine.formats.gguf import GGUFBlocks

log = logging.getLogger(__name__)
T = GGMLQuantizationType
COLUMNS = 16  # rows of the weight per panel: output columns of the product
# Inputs per super-block: the panel's unit (gguf_matmul.cpp's kSuper).
SUPER = {T.Q4_0: 32, T.Q4_1: 32, T.Q5_0: 32, T.Q5_1: 32, T.Q8_0: 32}
SUPER |= {t: 256 for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)}
TYPES = tuple(SUPER)


@dataclass
class GGUFPanels:
    """What gguf_matmul reads: the panels' bytes one after another, and per panel its byte offset and
    ggml type."""

    data: torch.Tensor  # uint8 [bytes]
    index: torch.Tensor  # int64 [panels, 2]
    in_features: int

    @property
    def out_features(self) -> int:
        return self.index.shape[0] * COLUMNS

    @property
    def types(self) -> list[str]:
        return [T(int(t)).name for t in self.index[:, 1].unique()]

    @staticmethod
    def cat(parts: list[GGUFPanels]) -> GGUFPanels:
        offsets = np.cumsum([0] + [p.data.numel() for p in parts[:-1]])
        index = torch.cat([p.index + torch.tensor([int(o), 0]) for p, o in zip(parts, offsets)])
        return GGUFPanels(torch.cat([p.data for p in parts]), index, parts[0].in_features)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.llmopt.gguf_matmul(x, self.data, self.index)

    def dequantize(self) -> torch.Tensor:
        """fp32 weight [out, in], through the kernel on the identity (test and reference use only): each
        row of the identity quantizes exactly, so the product is s * q - o rounded once in fp32."""
        eye = torch.eye(self.in_features)
        return torch.cat([self.matmul(rows) for rows in eye.split(512)]).t().contiguous()


def supported() -> bool:
    """Whether this CPU runs the GGUF kernel (AVX-512 VNNI + BW); elsewhere the blocks are converted to
    the generic int4 / int8 panels (quantized_panels.py)."""
    return kernels.load() and bool(torch.ops.llmopt.gguf_matmul_supported())


# Pairs of one-row steps timed, each way once a pair, in alternating order: the machine's speed swings by
# a third over tens of seconds, so only steps side by side are compared.
PREFETCH_TIMING_PAIRS = 6
# Prefetching at one row is chosen when its median step is this share of the step without or less: where
# the two are close, or prefetching is slower (a Zen 4: 0.90-0.94x the speed), the default measured there
# stays.
PREFETCH_WIN = 0.97
# The choice, made once a process: the kernel's flag is process-wide (the CPU's prefetcher decides it).
_one_row_prefetch: bool | None = None


def choose_one_row_prefetch(one_row_step: Callable[[], object]) -> bool:
    """Whether the kernel prefetches a one-row call's panels too, decided by timing `one_row_step` (a
    decode step of one sequence through the model's GGUF linears) both ways; sets the kernel's flag."""
    global _one_row_prefetch
    if _one_row_prefetch is None:
        ratios = []
        for pair in range(PREFETCH_TIMING_PAIRS):
            seconds = {}
            for on in (True, False) if pair % 2 else (False, True):
                torch.ops.llmopt.gguf_set_one_row_prefetch(on)
                start = time.perf_counter()
                one_row_step()
                seconds[on] = time.perf_counter() - start
            ratios.append(seconds[True] / seconds[False])
        ratio = statistics.median(ratios)
        _one_row_prefetch = ratio <= PREFETCH_WIN
        log.info("one-row steps prefetch the weights: %s (%.2fx the time without)", _one_row_prefetch, ratio)
    torch.ops.llmopt.gguf_set_one_row_prefetch(_one_row_prefetch)
    return _one_row_prefetch


def fits(blocks: GGUFBlocks) -> bool:
    rows = blocks.data.shape[0]
    return blocks.type in SUPER and rows % COLUMNS == 0 and blocks.in_features % SUPER[blocks.type] == 0


def words(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes start..stop of every block as little-endian u32 words [n, (stop - start) / 4]."""
    return np.ascontiguousarray(blocks[:, start:stop]).view("<u4")


def halves(blocks: np.ndarray, start: int, negate: bool = False) -> np.ndarray:
    """The fp16 field at `start` as its raw u16 bits [n, 1] (negated by flipping the sign bit)."""
    bits = np.ascontiguousarray(blocks[:, start : start + 2]).view("<u2")
    return bits ^ np.uint16(0x8000) if negate else bits


def q3_k_scales(blocks: np.ndarray) -> np.ndarray:
    """Q3_K's sixteen 6-bit sub-scales, minus 32, as int8 [n, 16] (gguf-py's unpacking)."""
    raw = blocks[:, 96:108]
    low = (raw[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 15
    high = (raw[:, 8:].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(
        -1, 16
    ) & 3
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def q6_k_triples(blocks: np.ndarray) -> np.ndarray:
    """Q6_K's value words in the order the kernel reads them, one stream: for half h and word w < 8, ql
    word 16h + w, ql word 16h + w + 8 and qh word 8h + w (which holds both words' high bits) side by
    side. Read from three places a super-block apart, the kernel streamed 8.6 GB/s from memory on one
    core; from one, 15.6 (a stand-alone loop over the 1.5B's ffn_down)."""
    ql = words(blocks, 0, 128).reshape(-1, 2, 2, 8)  # [n, half, w or w + 8, w]
    qh = words(blocks, 128, 192).reshape(-1, 2, 8)
    return np.stack([ql[:, :, 0], ql[:, :, 1], qh], axis=3).reshape(-1, 48)


# Per type, a super-block's pieces in the kernel's order, each [n super-blocks, count] of one dtype.
Pieces = list[np.ndarray]


def legacy_pieces(blocks: np.ndarray, qtype: GGMLQuantizationType) -> Pieces:
    offset = qtype in (T.Q4_1, T.Q5_1)
    fifth = qtype in (T.Q5_0, T.Q5_1)
    quants = 2 + 2 * offset + 4 * fifth  # where the 16 nibble bytes start
    pieces = [halves(blocks, 0)] + ([halves(blocks, 2, negate=True)] if offset else [])
    pieces.append(words(blocks, quants, quants + 16))
    return pieces + ([words(blocks, quants - 4, quants)] if fifth else [])


def k_scale_pieces(blocks: np.ndarray) -> Pieces:
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return [halves(blocks, 0), halves(blocks, 2), sc.astype(np.uint8), m.astype(np.uint8)]


PIECES: dict[GGMLQuantizationType, Callable[[np.ndarray], Pieces]] = {
    T.Q4_0: lambda b: legacy_pieces(b, T.Q4_0),
    T.Q4_1: lambda b: legacy_pieces(b, T.Q4_1),
    T.Q5_0: lambda b: legacy_pieces(b, T.Q5_0),
    T.Q5_1: lambda b: legacy_pieces(b, T.Q5_1),
    # the signed bytes plus 128: the kernel's u8 operand as stored (its zero point is 128)
    T.Q8_0: lambda b: [halves(b, 0), words(b, 2, 34) ^ np.uint32(0x80808080)],
    T.Q2_K: lambda b: [halves(b, 80), halves(b, 82), b[:, :16] & 15, b[:, :16] >> 4, words(b, 16, 80)],
    T.Q3_K: lambda b: [halves(b, 108), q3_k_scales(b), words(b, 32, 96), words(b, 0, 32)],
    T.Q4_K: lambda b: k_scale_pieces(b) + [words(b, 16, 144)],
    T.Q5_K: lambda b: k_scale_pieces(b) + [words(b, 48, 176), words(b, 16, 48)],
    # two bytes of padding a row after d: 3,392 bytes a panel's super-block, whole cache lines (3,360 put
    # every other super-block's 64-byte loads across two lines)
    T.Q6_K: lambda b: [
        halves(b, 208),
        np.zeros((len(b), 2), np.uint8),
        b[:, 192:208].view(np.int8),
        q6_k_triples(b),
    ],
}


def fifth_bit_masks(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's interleaved fifth bits [panels, supers, 64] (a u32 per row) as the kernel's 8 masks
    of 64 bits: mask j (< 4: word j's low nibbles, else word j - 4's high) has bit 4c + i set where row c's
    input 4j + i (16 + 4(j - 4) + i) has its fifth bit."""
    bits = qh.view("<u4").astype(np.uint64)  # [panels, supers, 16 rows]
    lanes = np.arange(COLUMNS, dtype=np.uint64) * np.uint64(4)
    masks = [
        (((bits >> np.uint64(16 * (j // 4) + 4 * (j % 4))) & np.uint64(15)) << lanes).sum(
            axis=2, dtype=np.uint64
        )
        for j in range(8)
    ]
    return np.ascontiguousarray(np.stack(masks, axis=2).astype("<u8")).view(np.uint8)


def interleave(piece: np.ndarray, panels: int, supers: int) -> np.ndarray:
    """[rows * supers, count] -> bytes [panels, supers, count * 16 * itemsize]: each of a super-block's
    `count` values of the panel's 16 rows side by side."""
    grouped = piece.reshape(panels, COLUMNS, supers, -1).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(grouped).reshape(panels, supers, -1).view(np.uint8)


def pack(blocks: GGUFBlocks) -> GGUFPanels:
    """The blocks' rows, 16 at a time, as gguf_matmul's panels."""
    assert fits(blocks), (blocks.type, blocks.data.shape, blocks.in_features)
    rows = blocks.data.shape[0]
    panels, supers = rows // COLUMNS, blocks.in_features // SUPER[blocks.type]
    per_block = blocks.data.reshape(rows * supers, -1)  # one super-block a row
    interleaved = [interleave(piece, panels, supers) for piece in PIECES[blocks.type](per_block)]
    if blocks.type in (T.Q5_0, T.Q5_1):
        interleaved[-1] = fifth_bit_masks(interleaved[-1])
    data = np.concatenate(interleaved, axis=2).reshape(panels, -1)
    offsets = np.arange(panels, dtype=np.int64) * data.shape[1]
    index = np.stack([offsets, np.full(panels, int(blocks.type), np.int64)], axis=1)
    return GGUFPanels(torch.from_numpy(data.reshape(-1)), torch.from_numpy(index), blocks.in_features)
