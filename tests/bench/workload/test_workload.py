import json

import pytest

from llmopt.bench.workload import (
    copy_heavy_prompts,
    count_tokens,
    file_prompts,
    random_prompts,
    shared_prefix_prompts,
)
from llmopt.checkpoints import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.mark.parametrize("length", [1, 17, 128, 1024])
def test_random_prompts_have_the_exact_token_length(tokenizer, length):
    prompts = random_prompts(tokenizer, 5, length, 32, seed=3)
    assert [count_tokens(tokenizer, p.prompt) for p in prompts] == [length] * 5
    assert len({p.prompt for p in prompts}) == 5 and all(p.max_tokens == 32 for p in prompts)
    assert random_prompts(tokenizer, 5, length, 32, seed=3) == prompts  # seeded


def test_shared_prefix_prompts_share_their_prefix(tokenizer):
    prompts = shared_prefix_prompts(tokenizer, 6, prefix_len=64, num_prefixes=2, prompt_len=16, output_len=8)
    heads = {p.prompt.split("\n")[0][:40] for p in prompts}
    assert len(heads) == 2
    assert all(count_tokens(tokenizer, p.prompt) == p.prompt_tokens >= 64 + 16 for p in prompts)


def test_copy_heavy_prompts_ask_to_repeat(tokenizer):
    [p] = copy_heavy_prompts(tokenizer, 1, 64, 64)
    assert p.prompt.startswith("Repeat the following text exactly")


def test_jsonl_and_sharegpt_files(tokenizer, tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        json.dumps({"prompt": "Hello there", "max_tokens": 7})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "Hi"}]})
        + "\n"
    )
    a, b = file_prompts(jsonl, tokenizer, default_output_len=20)
    assert (a.prompt, a.max_tokens, b.messages[0]["content"], b.max_tokens) == ("Hello there", 7, "Hi", 20)
    share = tmp_path / "sharegpt.json"
    conv = [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "It is four."}]
    share.write_text(json.dumps([{"conversations": conv}, {"conversations": conv[:1]}]))
    [c] = file_prompts(share, tokenizer, default_output_len=20)
    assert c.prompt == "What is 2+2?" and c.max_tokens == count_tokens(tokenizer, "It is four.")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(ValueError, match='needs "prompt" or "messages"'):
        file_prompts(bad, tokenizer, 20)
