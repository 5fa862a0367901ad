from __future__ import annotations

import logging
from pathlib import Path

import torch

from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.models.llama import AttentionGroup, AttentionMetadata, load_model
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Owns the model and the KV cache; turns a scheduled batch into tensors, runs it, samples."""

    def __init__(self, config: EngineConfig, model_dir: Path, max_model_len: int):
        self.dtype = DTYPES[config.dtype]
        self.block_size = config.block_size
        self.model = load_model(model_dir, self.dtype)
        model_config = self.model.config
        self.cos, self.sin = (t.to(self.dtype) for t in self.model.rope_cos_sin(max_model_len))
        num_layers = model_config.num_hidden_layers
        kv_shape = (self.block_size, self.model.num_kv_heads, self.model.head_dim)
        bytes_per_block = 2 * num_layers * kv_shape[0] * kv_shape[1] * kv_shape[2] * self.dtype.itemsize
        # The compiled kernels are fp32 and cover the usual head sizes; otherwise PyTorch's ops run.
        self.use_kernels = (
            self.dtype == torch.float32
            and self.model.head_dim in kernels.HEAD_DIMS
            and self.model.config.num_attention_heads // self.model.num_kv_heads <= kernels.MAX_GROUP
            and config.block_size <= kernels.MAX_BLOCK_SIZE
            and kernels.load()
        )
        if self.use_kernels:
            self.model.pack_linears()
        self.num_kv_blocks = config.num_kv_blocks or max(
            1, int(config.kv_cache_memory_gb * 2**30) // bytes_per_block
        )
        # One preallocated tensor holds every layer's keys and values: [layers, 2, blocks, block, heads, dim].
        self.kv_cache = torch.zeros(num_layers, 2, self.num_kv_blocks, *kv_shape, dtype=self.dtype)
        log.info(
            "KV cache: %d blocks of %d tokens (%.0f MiB)",
            self.num_kv_blocks,
            self.block_size,
            self.kv_cache.numel() * self.dtype.itemsize / 2**20,
        )

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
        num_blocks = -(-len(token_ids) // self.block_size)
        assert num_blocks <= self.num_kv_blocks, "the KV pool is smaller than the text"
        seq = Sequence("score", token_ids, SamplingParams(), seed=0)
        seq.block_table = list(range(num_blocks))
        return self.run(ScheduledBatch([seq], [len(token_ids)]), [len(token_ids)])

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata, dict[int, int]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: dict[int, int] = {}
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens
            tokens = seq.token_ids + seq.spec_token_ids if seq.spec_token_ids else seq.token_ids
            input_ids.extend(tokens[start : start + n])
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            last_rows[id(seq)] = len(input_ids) - 1
        num_decode = sum(1 for n in batch.num_new_tokens if n == 1)
        pos_tensor = torch.tensor(positions)
        decode_seqs = list(zip(batch.seqs[:num_decode], batch.num_new_tokens[:num_decode]))
        prefill_seqs = list(zip(batch.seqs[num_decode:], batch.num_new_tokens[num_decode:]))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            cos=self.cos[pos_tensor].unsqueeze(1),
            sin=self.sin[pos_tensor].unsqueeze(1),
            num_decode_tokens=num_decode,
            use_kernels=self.use_kernels,
            decode=self.attention_group(decode_seqs, single_query=True) if decode_seqs else None,
            prefill=self.attention_group(prefill_seqs, single_query=False) if prefill_seqs else None,
        )
        return torch.tensor(input_ids), meta, last_rows

    def attention_group(self, seqs: list[tuple[Sequence, int]], single_query: bool) -> AttentionGroup:
        bs = self.block_size
        context_lens = [s.num_computed_tokens + n for s, n in seqs]
        blocks_per_seq = -(-max(context_lens) // bs)
        block_tables = torch.zeros(len(seqs), blocks_per_seq, dtype=torch.long)
        for i, (s, _) in enumerate(seqs):
            table = s.block_table[: -(-context_lens[i] // bs)]
            block_tables[i, : len(table)] = torch.tensor(table)
        lens = torch.tensor(context_lens)
        key_pos = torch.arange(blocks_per_seq * bs)
        if single_query:
            mask = None if self.use_kernels else (key_pos[None, :] < lens[:, None])[:, None, None, :]
            return AttentionGroup(block_tables, lens, mask, None, None)
        num_new = torch.tensor([n for _, n in seqs])
        max_q = int(num_new.max())
        q_offset = torch.arange(max_q)[None, :].minimum(num_new[:, None] - 1)  # pad with the last query
        row_start = torch.cumsum(num_new, 0) - num_new
        query_index = row_start[:, None] + q_offset
        query_pos = torch.tensor([s.num_computed_tokens for s, _ in seqs])[:, None] + q_offset
        mask = key_pos[None, None, :] <= query_pos[:, :, None]  # causal, through the cached prefix
        valid = (torch.arange(max_q)[None, :] < num_new[:, None]).flatten().nonzero().squeeze(1)
        return AttentionGroup(block_tables, lens, mask[:, None, :, :], query_index, valid)
