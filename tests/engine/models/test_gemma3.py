"""Gemma 3 on a small random-weight model built from transformers' own config, token for token against
transformers' Gemma3ForCausalLM: a sliding window of 8 with prompts far longer than it, local and global
layers with their own rotary bases, query_pre_attn_scalar, final soft-capping and random (1 + w) norms;
batched, with a prefix hit and chunked prefill, with the compiled kernels and on the PyTorch path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS
from tests.engine.test_architectures import MAX_NEW, AutoTokenizerFiles, transformers_greedy

WINDOW = 8


def gemma3_config(vocab: int) -> Gemma3TextConfig:
    return Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24,  # not head_dim: the attention scale must come from it
        final_logit_softcapping=30.0,
        max_position_embeddings=512,
        initializer_range=0.2,
    )


@pytest.fixture(scope="module")
def tiny_gemma3(model_dir, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    vocab = len(AutoTokenizerFiles.tokenizer(model_dir))
    model = AutoModelForCausalLM.from_config(gemma3_config(vocab), dtype=torch.float32).eval()
    with torch.no_grad():  # Gemma initialises norms at 0 (a scale of 1): random ones test the offset
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param) * 0.5)
    folder = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(folder)
    AutoTokenizerFiles.copy(model_dir, folder)
    return folder, model


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "pytorch"])
def test_gemma3_greedy_equals_transformers(tiny_gemma3, kernels, monkeypatch):
    folder, reference = tiny_gemma3
    if not kernels:
        monkeypatch.setattr("llmopt.engine.model_runner.kernels.load", lambda: False)
    llm = LLM(str(folder), num_kv_blocks=256, max_num_batched_tokens=64, block_size=4)
    assert llm.engine.runner.use_kernels == kernels
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    long = llm.tokenizer.encode(PROMPTS[7]) * 3  # over the 64-token budget: prefilled in chunks
    [first] = llm.generate([long], params)
    assert first.token_ids == transformers_greedy(reference, long)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS[:6]] + [long + llm.tokenizer.encode(PROMPTS[1])]
    outputs = llm.generate(prompts, params)
    assert outputs[-1].cached_tokens >= 64  # the long prefix came from the cache
    for prompt_ids, out in zip(prompts, outputs):
        assert len(prompt_ids) + MAX_NEW > 2 * WINDOW
        assert out.token_ids == transformers_greedy(reference, prompt_ids)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_gemma3_decode_steps_in_one_call_equal_the_per_layer_path(tiny_gemma3, kv_cache_dtype):
    """Decode rows run every layer in one compiled call (decode_gemma3_layers): the same kernels in the
    same order, so the same tokens and bit-identical log-probabilities, past the window, two rows a step."""
    folder, _ = tiny_gemma3
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True, logprobs=5)
    runs = []
    for one_call in (True, False):
        llm = LLM(str(folder), num_kv_blocks=64, block_size=4, kv_cache_dtype=kv_cache_dtype)
        model = llm.engine.runner.model
        assert model.decode_weights, "every layer has a compiled kernel: the one-call path is taken"
        if not one_call:
            model.decode_weights = None
        prompts = [llm.tokenizer.encode(PROMPTS[7]) * 2, llm.tokenizer.encode(PROMPTS[1])]
        runs.append([(out.token_ids, out.logprobs) for out in llm.generate(prompts, params)])
    assert runs[0] == runs[1]
