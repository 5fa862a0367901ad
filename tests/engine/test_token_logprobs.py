"""Logprobs against transformers' log-softmax of the same model (to 1e-4): of generated tokens, with
their top-k, whatever the request samples with (they are the raw distribution's), and of prompt
tokens, across prefill chunks and never from the prefix cache."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.token_logprobs import TokenLogprob, token_logprobs
from tests.conftest import PROMPTS

TOLERANCE = 1e-4


def reference_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position of `token_ids` [len, vocab]."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_matches(record: TokenLogprob, reference: torch.Tensor, num_top: int) -> None:
    """`record` against the reference row its token was drawn from."""
    assert abs(record.logprob - float(reference[record.token_id])) < TOLERANCE
    assert len(record.top) == num_top
    top_values = torch.topk(reference, num_top).values if num_top else torch.empty(0)
    for (token_id, logprob), expected in zip(record.top, top_values.tolist()):
        assert abs(logprob - expected) < TOLERANCE  # the k-th likeliest, whichever of a near tie it is
        assert abs(logprob - float(reference[token_id])) < TOLERANCE


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0},
        {"temperature": 0.7, "top_k": 5, "seed": 3},
        {"temperature": 0, "frequency_penalty": 2.0, "logit_bias": {11: 5.0}},
    ],
)
def test_output_logprobs_are_the_models_own(llm, hf_model, sampling):
    ids = llm.tokenizer.encode(PROMPTS[2])
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=5, **sampling)
    [out] = llm.generate([ids], params)
    assert [r.token_id for r in out.logprobs] == out.token_ids
    reference = reference_logprobs(hf_model, ids + out.token_ids)
    for i, record in enumerate(out.logprobs):
        assert_matches(record, reference[len(ids) - 1 + i], 5)
    assert out.prompt_logprobs is None


def test_prompt_logprobs_cover_every_prompt_token_across_chunks_and_skip_the_cache(llm, hf_model):
    long_prompt = llm.tokenizer.encode(" ".join(PROMPTS * 6))
    assert len(long_prompt) > llm.engine.config.max_num_batched_tokens  # prefilled in chunks
    llm.generate([long_prompt], SamplingParams(max_tokens=1, temperature=0))  # now in the prefix cache
    short = llm.tokenizer.encode(PROMPTS[0])
    scored, generated = llm.generate(
        [long_prompt, short],
        [
            SamplingParams(max_tokens=0, prompt_logprobs=3),  # echo with max_tokens 0: only the prompt
            SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=2, logprobs=1),
        ],
    )
    assert scored.token_ids == [] and scored.finish_reason == "length" and scored.cached_tokens == 0
    for prompt, out, k in [(long_prompt, scored, 3), (short, generated, 2)]:
        assert [r.token_id for r in out.prompt_logprobs] == prompt
        first = out.prompt_logprobs[0]
        assert first.logprob is None and first.top is None  # nothing predicts the first token
        reference = reference_logprobs(hf_model, prompt + out.token_ids)
        for i, record in enumerate(out.prompt_logprobs[1:], start=1):
            assert_matches(record, reference[i - 1], k)
    assert len(generated.logprobs) == len(generated.token_ids) == 4
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_a_token_s_rank_counts_the_tokens_likelier_than_it():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.0, 0.0]])
    first, second = token_logprobs(logits, [2, 0], num_top=1)
    assert (first.rank, second.rank) == (3, 1)  # 3.0 and 2.0 beat 1.0; 5.0 is the likeliest
    assert first.top[0][0] == 1 and second.top[0][0] == 0
