"""`--tokenizer DIR`: a folder holding only a tokenizer is enough to count prompt tokens with."""

from __future__ import annotations

import shutil

import pytest

from llmopt.bench.workload import count_tokens, random_prompts
from llmopt.checkpoints import ModelError, load_tokenizer, resolve_tokenizer


def test_a_tokenizer_only_folder_is_accepted_and_loads(tokenizer_dir):
    assert sorted(p.name for p in tokenizer_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert resolve_tokenizer(str(tokenizer_dir)) == tokenizer_dir
    tokenizer = load_tokenizer(resolve_tokenizer(str(tokenizer_dir)))
    prompts = random_prompts(tokenizer, 3, 20, 4, seed=1)
    assert [count_tokens(tokenizer, p.prompt) for p in prompts] == [20, 20, 20]


def test_tokenizer_json_alone_is_enough(tokenizer_dir, tmp_path):
    only = tmp_path / "only-json"
    only.mkdir()
    shutil.copy(tokenizer_dir / "tokenizer.json", only)
    tokenizer = load_tokenizer(resolve_tokenizer(str(only)))
    assert count_tokens(tokenizer, "The pattern is looked up") == 5


def test_anything_else_is_resolved_as_a_model(tmp_path):
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_tokenizer(str(tmp_path))  # an empty folder is neither a tokenizer nor a model
    with pytest.raises(ModelError, match="model not found"):
        resolve_tokenizer(str(tmp_path / "nope"))
