"""Every architecture the engine serves, on small random-weight models built from transformers' own
configs, token for token against transformers' greedy decode: Qwen2 (q/k/v bias), Qwen3 (q/k norm),
Mistral, Llama 3 rope scaling, and plain Llama; each with the compiled kernels (the one-call decode
step where the architecture takes it) and on the PyTorch path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,  # spread-out logits: greedy picks are not near-ties
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CONFIGS = {
    "llama": lambda vocab: LlamaConfig(vocab_size=vocab, **SMALL),
    "llama3-rope": lambda vocab: LlamaConfig(vocab_size=vocab, rope_parameters=LLAMA3_ROPE, **SMALL),
    "mistral": lambda vocab: MistralConfig(vocab_size=vocab, sliding_window=None, **SMALL),
    "qwen2": lambda vocab: Qwen2Config(vocab_size=vocab, **SMALL),
    "qwen3": lambda vocab: Qwen3Config(vocab_size=vocab, head_dim=32, **SMALL),
}
MAX_NEW = 12


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_model(request, model_dir, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    """A seeded random model of one architecture, saved with the bundled model's tokenizer."""
    name = request.param
    torch.manual_seed(0)
    vocab = len(AutoTokenizerFiles.tokenizer(model_dir))
    model = AutoModelForCausalLM.from_config(CONFIGS[name](vocab), dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    AutoTokenizerFiles.copy(model_dir, folder)
    return name, folder, model


class AutoTokenizerFiles:
    FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    @staticmethod
    def tokenizer(model_dir: Path):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)

    @classmethod
    def copy(cls, source: Path, target: Path) -> None:
        for name in cls.FILES:
            if (source / name).is_file():
                shutil.copy(source / name, target / name)


def transformers_greedy(model: torch.nn.Module, prompt_ids: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW,  # as ignore_eos: a random model may well pick an EOS id
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "pytorch"])
def test_greedy_equals_transformers(tiny_model, kernels, monkeypatch):
    name, folder, reference = tiny_model
    if not kernels:
        monkeypatch.setattr("llmopt.engine.model_runner.kernels.load", lambda: False)
    # A 64-token step budget and a small pool: batching, chunked prefill and prefix hits in one run.
    llm = LLM(str(folder), num_kv_blocks=64, max_num_batched_tokens=64)
    assert llm.engine.runner.use_kernels == kernels
    if name in ("llama", "llama3-rope", "mistral") and kernels:
        assert llm.engine.runner.model.decode_weights, f"{name} should take the one-call decode step"
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    long = llm.tokenizer.encode(PROMPTS[7]) * 3  # over the 64-token budget: prefilled in chunks
    [first] = llm.generate([long], params)
    assert first.token_ids == transformers_greedy(reference, long), name
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS[:6]] + [long + llm.tokenizer.encode(PROMPTS[1])]
    outputs = llm.generate(prompts, params)
    assert outputs[-1].cached_tokens >= 64  # the long prefix came from the cache
    for prompt_ids, out in zip(prompts, outputs):
        assert out.token_ids == transformers_greedy(reference, prompt_ids), name
