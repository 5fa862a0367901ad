"""Mixtral and Qwen3-MoE on small seeded random-weight models built from transformers' own configs,
token for token against transformers' greedy decode: batched prompts, a prefix hit, chunked prefill (a
64-token step budget) and preemption (a KV pool too small for the batch), with the compiled kernels and
on the PyTorch path. No small real MoE checkpoint exists offline, so these are the correctness check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

from llmopt.engine.llm import LLM
from llmopt.engine.models.moe import MoeDecoderLayer
from llmopt.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS
from tests.engine.test_architectures import MAX_NEW, AutoTokenizerFiles, transformers_greedy

SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "num_experts_per_tok": 2,
    "initializer_range": 0.2,  # spread-out logits and router scores: no near-ties in greedy or top-k
}
CONFIGS = {
    "mixtral": lambda vocab: MixtralConfig(
        vocab_size=vocab, intermediate_size=64, num_local_experts=8, sliding_window=None, **SMALL
    ),
    # Renormalised top-k, and a dense MLP in layer 1 (mlp_only_layers) between sparse layers.
    "qwen3_moe": lambda vocab: Qwen3MoeConfig(
        vocab_size=vocab,
        **{**SMALL, "num_hidden_layers": 3},
        head_dim=32,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    # Qwen3-MoE's default routing (top-k weights not renormalised), sparse every second layer.
    "qwen3_moe-sparse-step": lambda vocab: Qwen3MoeConfig(
        vocab_size=vocab,
        **{**SMALL, "num_experts_per_tok": 3},
        head_dim=32,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=6,
        norm_topk_prob=False,
        decoder_sparse_step=2,
    ),
}
SPARSE_LAYERS = {"mixtral": [0, 1], "qwen3_moe": [0, 2], "qwen3_moe-sparse-step": [1]}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_moe(request, model_dir, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    """A seeded random MoE model, saved with save_pretrained and the bundled model's tokenizer."""
    name = request.param
    torch.manual_seed(0)
    vocab = len(AutoTokenizerFiles.tokenizer(model_dir))
    model = AutoModelForCausalLM.from_config(CONFIGS[name](vocab), dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    AutoTokenizerFiles.copy(model_dir, folder)
    return name, folder, model


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "pytorch"])
def test_greedy_equals_transformers(tiny_moe, kernels, monkeypatch):
    name, folder, reference = tiny_moe
    if not kernels:
        monkeypatch.setattr("llmopt.engine.model_runner.kernels.load", lambda: False)
    # A 64-token step budget and a small pool: batching, chunked prefill and prefix hits in one run.
    llm = LLM(str(folder), num_kv_blocks=64, max_num_batched_tokens=64)
    assert llm.engine.runner.use_kernels == kernels
    model = llm.engine.runner.model
    sparse = [i for i, layer in enumerate(model.layers) if isinstance(layer, MoeDecoderLayer)]
    assert sparse == SPARSE_LAYERS[name]
    assert not model.decode_weights, "MoE layers run layer by layer, not through decode_layers"
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    long = llm.tokenizer.encode(PROMPTS[7]) * 3  # over the 64-token budget: prefilled in chunks
    [first] = llm.generate([long], params)
    assert first.token_ids == transformers_greedy(reference, long), name
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS[:6]] + [long + llm.tokenizer.encode(PROMPTS[1])]
    outputs = llm.generate(prompts, params)
    assert outputs[-1].cached_tokens >= 64  # the long prefix came from the cache
    for prompt_ids, out in zip(prompts, outputs):
        assert out.token_ids == transformers_greedy(reference, prompt_ids), name


def test_preemption_keeps_outputs_exact(tiny_moe):
    name, folder, reference = tiny_moe
    # 8 blocks of 16 tokens cannot hold 6 prompts growing by 12 tokens each: some are preempted.
    llm = LLM(str(folder), num_kv_blocks=8, max_num_batched_tokens=64)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS[:6]]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0, "the pool is small enough that preemption must happen"
    for prompt_ids, out in zip(prompts, outputs):
        assert out.token_ids == transformers_greedy(reference, prompt_ids), name
