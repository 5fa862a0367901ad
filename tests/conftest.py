"""Session-wide fixtures: one engine on the real default model and its transformers reference."""

from __future__ import annotations

import functools

import pytest
import torch

from llmopt.engine.llm import LLM
from llmopt.models import resolve_model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a dragon who loved",
    "1, 2, 3, 4,",
    "Translate to French: I would like a cup of coffee, please.",
    "The three primary colors are",
    "Q: What is the boiling point of water at sea level?\nA:",
    "import numpy as np\nimport torch\n\n# Load the dataset and split it into training and validation sets\n"
    "def load_data(path):",
    "Here is a list of ten fruits: apple, banana,",
    "In 1969, astronauts",
]


@pytest.fixture(scope="session")
def model_dir():
    return resolve_model()


@pytest.fixture(scope="session")
def llm(model_dir) -> LLM:
    return LLM(str(model_dir), num_kv_blocks=512)


@pytest.fixture(scope="session")
def hf_greedy(model_dir, llm):
    """transformers' own greedy decode (batch 1), cut at the first token the engine treats as EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos = llm.engine.eos_token_ids

    @functools.cache
    def run(prompt_ids: tuple[int, ...], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
            )
        tokens = out[0, len(prompt_ids) :].tolist()
        for i, t in enumerate(tokens):
            if t in eos:
                return tokens[: i + 1]
        return tokens

    return run
