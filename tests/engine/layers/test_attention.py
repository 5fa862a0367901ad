"""Prefill attention over the paged cache (layers/attention.py): a step whose rows all start at position 0
takes SDPA's causal path, which must give the bits the mask gives; rows with a cached prefix, and
sliding windows, keep the mask."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from llmopt.engine.layers.attention import attend_prefill, windowed
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM = 16, 9, 3, 64


def sequence(computed: int, blocks: list[int]) -> Sequence:
    seq = Sequence("r", [1] * 200, SamplingParams(temperature=0), seed=0)
    seq.num_computed_tokens, seq.block_table = computed, blocks
    return seq


def prefill_group(seqs: list[tuple[Sequence, int]]):
    return ModelRunner.prefill_group(SimpleNamespace(block_size=BLOCK_SIZE), seqs)


def test_only_steps_of_fresh_rows_are_causal():
    fresh = [(sequence(0, [3, 1, 4]), 40), (sequence(0, [0, 2]), 23)]
    assert prefill_group(fresh).causal
    assert not prefill_group([*fresh, (sequence(16, [5, 6]), 10)]).causal
    assert not windowed(prefill_group(fresh), 8).causal
    assert windowed(prefill_group(fresh), 0).causal  # a global layer keeps the causal path


def test_the_causal_path_equals_the_mask_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(8, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(8, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    group = prefill_group([(sequence(0, [3, 1, 4]), 40), (sequence(0, [0, 2]), 23)])  # padded to 40 queries
    q = torch.randn(40 + 23, HEADS, HEAD_DIM, generator=gen)
    causal = attend_prefill(q, k_cache, v_cache, group, HEAD_DIM**-0.5)
    masked = attend_prefill(q, k_cache, v_cache, dataclasses.replace(group, causal=False), HEAD_DIM**-0.5)
    assert torch.equal(causal, masked)
