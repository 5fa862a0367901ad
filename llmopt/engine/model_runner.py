from __future__ import annotations

import logging
from pathlib import Path

import torch

from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.models.llama import AttentionGroup, AttentionMetadata, load_model
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
        # The compiled decode-attention kernel is fp32; other dtypes use PyTorch's SDPA.
        self.use_kernels = self.dtype == torch.float32 and kernels.load()
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
    def run(self, batch: ScheduledBatch, sample_seqs: list[Sequence], stop_ids: set[int]) -> list[int]:
        """Compute the batch; return one sampled token for each of `sample_seqs` (in that order).

        `sample_seqs` are the batch's sequences whose new tokens reach the end of their context.
        """
        input_ids, meta, last_rows = self.prepare(batch)
        hidden = self.model(input_ids, self.kv_cache, meta)
        if not sample_seqs:
            return []
        rows = torch.tensor([last_rows[id(s)] for s in sample_seqs])
        logits = self.model.logits(hidden[rows])
        return sample(logits, sample_seqs, stop_ids)

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata, dict[int, int]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: dict[int, int] = {}
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
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


def sample(logits: torch.Tensor, seqs: list[Sequence], stop_ids: set[int]) -> list[int]:
    """Greedy rows by argmax; sampled rows with temperature, top-k, top-p and a per-request generator."""
    for i, seq in enumerate(seqs):
        if seq.num_output_tokens < seq.params.min_tokens:  # not allowed to stop yet
            banned = list(stop_ids | set(seq.params.stop_token_ids))
            logits[i, banned] = float("-inf")
    tokens = logits.argmax(dim=-1).tolist()
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if not sampled:
        return tokens
    rows = logits[sampled]
    rows = rows / torch.tensor([[seqs[i].params.temperature] for i in sampled])
    for j, i in enumerate(sampled):
        top_k = seqs[i].params.top_k
        if 0 < top_k < rows.shape[1]:
            kth = torch.topk(rows[j], top_k).values[-1]
            rows[j].masked_fill_(rows[j] < kth, float("-inf"))
    top_p = torch.tensor([[seqs[i].params.top_p] for i in sampled])
    if bool((top_p < 1).any()):
        sorted_logits, order = rows.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already cover top_p; the first token always stays.
        drop = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        rows = rows.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = rows.softmax(dim=-1)
    for j, i in enumerate(sampled):
        tokens[i] = int(torch.multinomial(probs[j], 1, generator=seqs[i].generator))
    return tokens
