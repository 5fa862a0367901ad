from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from llmopt.engine import kernels, memory
from llmopt.engine.block_manager import num_blocks_for
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers import gguf_panels, int8_kv_cache
from llmopt.engine.layers.attention import AttentionGroup, AttentionMetadata
from llmopt.engine.models.decode_reads import decode_weight_bytes
from llmopt.engine.models.kernel_layout import pack_for_kernels
from llmopt.engine.models.loaded_model_cache import load_model_cached
from llmopt.engine.models.model_config import read_model_config
from llmopt.engine.precision import resolve_precision, startup_line
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence

log = logging.getLogger(__name__)

# Sequences with at most this many new tokens attend one query row at a time (the decode kernel reads
# the context once per row); longer chunks attend as a padded prefill group.
MAX_DECODE_QUERIES = 8


class ModelRunner:
    """Owns the model and the KV cache; turns a scheduled batch into tensors and runs it, returning the
    logits rows the engine samples from (sampling lives in sampler.py)."""

    def __init__(self, config: EngineConfig, checkpoint: Path, max_model_len: int, q4_0: bool = False):
        self.precision = resolve_precision(config.dtype, checkpoint)
        self.dtype = self.precision.compute
        self.block_size = config.block_size
        model_config = read_model_config(checkpoint)
        num_layers = model_config.num_hidden_layers
        head_dim = (
            getattr(model_config, "head_dim", None)
            or model_config.hidden_size // model_config.num_attention_heads
        )
        # int8: head_dim values and a 4-byte scale per token-head row, so ~4x the blocks in the same memory.
        row, kv_dtype = int8_kv_cache.cache_row(head_dim, config.kv_cache_dtype, self.dtype)
        kv_shape = (self.block_size, model_config.num_key_value_heads, row)
        weights = memory.weights_bytes(checkpoint, self.precision.native_gguf, self.dtype.itemsize)
        kv_gb = config.kv_cache_memory_gb or memory.default_kv_gb(weights)
        self.num_kv_blocks = config.num_kv_blocks or int8_kv_cache.pool_blocks(
            kv_gb, num_layers, kv_shape, kv_dtype
        )
        kv_bytes = num_layers * 2 * self.num_kv_blocks * math.prod(kv_shape) * kv_dtype.itemsize
        memory.check_fits(checkpoint, weights, kv_bytes)
        self.model = load_model_cached(
            checkpoint, self.dtype, self.precision.native_gguf, config.lm_head_dtype, q4_0
        )
        self.cos, self.sin = (t.to(self.dtype) for t in self.model.rope_cos_sin(max_model_len))
        # The compiled kernels are fp32 and cover the usual head sizes; otherwise PyTorch's ops run.
        self.use_kernels = (
            self.dtype == torch.float32
            and self.model.head_dim in kernels.HEAD_DIMS
            and self.model.config.num_attention_heads // self.model.num_kv_heads <= kernels.MAX_GROUP
            and config.block_size <= kernels.MAX_BLOCK_SIZE
            and kernels.load()
        )
        if self.use_kernels:
            pack_for_kernels(self.model)
        self.decode_weight_bytes = decode_weight_bytes(self.model)
        # One preallocated tensor holds every layer's keys and values: [layers, 2, blocks, block, heads, dim].
        self.kv_cache = zeroed_on_first_touch((num_layers, 2, self.num_kv_blocks, *kv_shape), kv_dtype)
        kv_tokens = self.num_kv_blocks * self.block_size
        log.info(
            "KV cache: %d blocks of %d tokens (%.0f MiB, %s)",
            self.num_kv_blocks,
            self.block_size,
            kv_bytes / 2**20,
            kv_dtype,
        )
        self.startup_line = startup_line(self.precision, self.model, kv_dtype, self.use_kernels, kv_tokens)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, num_logits: list[int]) -> torch.Tensor:
        """Compute the batch; return fp32 logits [sum(num_logits), vocab]: for each sequence, those of
        its last `num_logits[i]` computed positions (0 for a prefill chunk that is not the last one)."""
        input_ids, meta, last_rows = self.prepare(batch)
        hidden = self.model(input_ids, self.kv_cache, meta)
        rows = [
            row
            for seq, count in zip(batch.seqs, num_logits)
            for row in range(last_rows[id(seq)] - count + 1, last_rows[id(seq)] + 1)
        ]
        if not rows:
            return torch.empty(0, self.model.config.vocab_size)
        return self.model.logits(hidden[torch.tensor(rows)])

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """fp32 logits [len, vocab] at every position of `token_ids`, in one forward from an empty
        cache (what perplexity needs). It writes KV blocks 0..n: only for a runner no engine uses."""
        num_blocks = num_blocks_for(len(token_ids), self.block_size)
        assert num_blocks <= self.num_kv_blocks, "the KV pool is smaller than the text"
        seq = Sequence("score", token_ids, SamplingParams(), seed=0)
        seq.block_table = list(range(num_blocks))
        return self.run(ScheduledBatch([seq], [len(token_ids)]), [len(token_ids)])

    @torch.inference_mode()
    def warm_up(self, num_tokens: int) -> None:
        """One prefill of `num_tokens` and one decode step on blocks 0.., before any sequence holds a
        block (nothing is registered in the prefix cache: the blocks are overwritten before they are read),
        so that the first request finds the calling thread's OpenMP pool, its allocator heap and the step's
        buffers in place. A fresh engine's first 1,074-token prefill took 1,246 ms against 841-884 for
        the next three (one of two in-process runs; the other 958-999 throughout). Where the model runs
        GGUF panels, one-row steps timed both ways then decide whether they prefetch the weights
        (gguf_panels.choose_one_row_prefetch)."""
        num_tokens = min(num_tokens, self.num_kv_blocks * self.block_size - 1)
        seq = Sequence("warm-up", [0] * (num_tokens + 1), SamplingParams(), seed=0)
        seq.block_table = list(range(num_blocks_for(num_tokens + 1, self.block_size)))
        self.run(ScheduledBatch([seq], [num_tokens]), [1])
        seq.num_computed_tokens = num_tokens
        self.run(ScheduledBatch([seq], [1]), [1])
        if any(getattr(layer, "kernel", None) == "gguf" for layer in self.model.modules()):
            gguf_panels.choose_one_row_prefetch(lambda: self.run(ScheduledBatch([seq], [1]), [1]))

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata, dict[int, int]]:
        bs = self.block_size
        # Sequences with a few new tokens (decodes, speculative verifications, short prefill tails) come
        # first and attend one query row at a time; longer prefill chunks form the padded prefill group.
        entries = sorted(zip(batch.seqs, batch.num_new_tokens), key=lambda e: e[1] > MAX_DECODE_QUERIES)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: dict[int, int] = {}
        for seq, n in entries:
            start = seq.num_computed_tokens
            tokens = seq.token_ids + seq.spec_token_ids if seq.spec_token_ids else seq.token_ids
            input_ids.extend(tokens[start : start + n])
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            last_rows[id(seq)] = len(input_ids) - 1
        num_decode_seqs = sum(1 for _, n in entries if n <= MAX_DECODE_QUERIES)
        decode_seqs, prefill_seqs = entries[:num_decode_seqs], entries[num_decode_seqs:]
        pos_tensor = torch.tensor(positions)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            cos=self.cos[pos_tensor].unsqueeze(1),
            sin=self.sin[pos_tensor].unsqueeze(1),
            num_decode_tokens=sum(n for _, n in decode_seqs),
            use_kernels=self.use_kernels,
            decode=self.decode_group(decode_seqs) if decode_seqs else None,
            prefill=self.prefill_group(prefill_seqs) if prefill_seqs else None,
        )
        return torch.tensor(input_ids), meta, last_rows

    def decode_group(self, seqs: list[tuple[Sequence, int]]) -> AttentionGroup:
        """One row per new token: its sequence's block table, and the context up to and including it
        (the token's own key and value are in the cache by the time attention reads it)."""
        bs = self.block_size
        lens = torch.tensor([s.num_computed_tokens + i + 1 for s, n in seqs for i in range(n)])
        blocks_per_row = num_blocks_for(int(lens.max()), bs)
        block_tables = torch.zeros(len(lens), blocks_per_row, dtype=torch.long)
        row = 0
        for s, n in seqs:
            table = s.block_table[: num_blocks_for(s.num_computed_tokens + n, bs)]
            block_tables[row : row + n, : len(table)] = torch.tensor(table)
            row += n
        key_pos = torch.arange(blocks_per_row * bs)
        mask = None if self.use_kernels else (key_pos[None, :] < lens[:, None])[:, None, None, :]
        return AttentionGroup(block_tables, lens, mask, None, None)

    def prefill_group(self, seqs: list[tuple[Sequence, int]]) -> AttentionGroup:
        bs = self.block_size
        context_lens = [s.num_computed_tokens + n for s, n in seqs]
        blocks_per_seq = num_blocks_for(max(context_lens), bs)
        block_tables = torch.zeros(len(seqs), blocks_per_seq, dtype=torch.long)
        for i, (s, _) in enumerate(seqs):
            table = s.block_table[: num_blocks_for(context_lens[i], bs)]
            block_tables[i, : len(table)] = torch.tensor(table)
        lens = torch.tensor(context_lens)
        key_pos = torch.arange(blocks_per_seq * bs)
        num_new = torch.tensor([n for _, n in seqs])
        max_q = int(num_new.max())
        q_offset = torch.arange(max_q)[None, :].minimum(num_new[:, None] - 1)  # pad with the last query
        row_start = torch.cumsum(num_new, 0) - num_new
        query_index = row_start[:, None] + q_offset
        query_pos = torch.tensor([s.num_computed_tokens for s, _ in seqs])[:, None] + q_offset
        mask = key_pos[None, None, :] <= query_pos[:, :, None]  # causal, through the cached prefix
        valid = (torch.arange(max_q)[None, :] < num_new[:, None]).flatten().nonzero().squeeze(1)
        causal = all(s.num_computed_tokens == 0 for s, _ in seqs)
        return AttentionGroup(block_tables, lens, mask[:, None, :, :], query_index, valid, causal, num_new)


def zeroed_on_first_touch(shape: tuple[int, ...], dtype: torch.dtype, align: int = 64) -> torch.Tensor:
    """A zero tensor whose pages the OS zeroes when they are first written, 64-byte aligned. torch.zeros
    writes every page at once: for the default 1 GiB KV pool that was 1.0-1.2 s of a 5.7 s warm start,
    mostly for blocks a server never uses. numpy's zeros is calloc, which maps fresh zero pages."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.from_numpy(np.zeros(nbytes + align, dtype=np.uint8))
    offset = -raw.data_ptr() % align
    return raw[offset : offset + nbytes].view(dtype).view(shape)
