"""The sampler's distribution on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine.sampler import probabilities, sample_rows
from llmopt.engine.sampling_params import SamplingParams


@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 1e-3])
def test_a_vanishing_top_p_keeps_the_most_likely_token(top_p):
    logits = torch.tensor([[0.1, 2.0, 0.5, -1.0]])
    params = SamplingParams(temperature=1.0, top_p=top_p, max_tokens=1)
    probs = probabilities(logits, params)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert sample_rows(logits, params, torch.Generator().manual_seed(0)) == [1]


def test_top_k_and_top_p_keep_what_they_should():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7, max_tokens=1))
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    kept = probabilities(logits, SamplingParams(temperature=1.0, top_k=3, max_tokens=1))
    torch.testing.assert_close(kept, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)


def test_a_vanishing_temperature_is_greedy():
    assert SamplingParams(temperature=1e-39).greedy and not SamplingParams(temperature=1e-4).greedy


def test_min_p_drops_what_is_less_likely_than_min_p_times_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = probabilities(logits, SamplingParams(temperature=1.0, min_p=0.25, max_tokens=1))
    torch.testing.assert_close(kept, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    only_top = probabilities(logits, SamplingParams(temperature=1.0, min_p=1.0, max_tokens=1))
    assert torch.equal(only_top, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_min_p_applies_after_the_temperature():
    # At temperature 2 the distribution is flatter: 0.5 x the top keeps three tokens (before the
    # temperature it would keep two).
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = probabilities(logits, SamplingParams(temperature=2.0, min_p=0.5, max_tokens=1))
    flat = (logits / 2).softmax(dim=-1)
    flat[0, 3] = 0
    torch.testing.assert_close(kept, flat / flat.sum())
