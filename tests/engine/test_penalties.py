"""Penalties and logit_bias on hand-made logits against their definitions (OpenAI's frequency and
presence penalties, vLLM's / transformers' repetition penalty), and in the engine: a greedy request
re-picks its token after they change the logits, token for token as transformers with the same
penalties decodes."""

from __future__ import annotations

import pytest
import torch

from llmopt.engine.penalties import apply_penalties
from llmopt.engine.sampler import probabilities, sample_rows
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence
from tests.conftest import PROMPTS

PROMPT = [1, 2, 7]
OUTPUT = [2, 3, 3, 5]


def sequence(params: SamplingParams, proposals: list[int] | None = None) -> Sequence:
    seq = Sequence("s", PROMPT, params, seed=0)
    seq.token_ids += OUTPUT
    seq.spec_token_ids = list(proposals or [])
    return seq


def by_definition(row: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    """The definitions, one token at a time: bias, then repetition, then frequency and presence."""
    row, rep = list(row), p.repetition_penalty
    for token, bias in p.logit_bias.items():
        row[token] += bias
    for token in range(len(row)):
        if token in prompt or token in output:
            row[token] = row[token] / rep if row[token] > 0 else row[token] * rep
        count = output.count(token)
        row[token] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
    return row


LOGITS = [1.5, -0.5, 2.0, -1.0, 0.7, 3.0, -2.5, 0.4]
CASES = {
    "frequency": SamplingParams(frequency_penalty=0.5),
    "presence": SamplingParams(presence_penalty=-0.75),
    "repetition": SamplingParams(repetition_penalty=1.5),
    "bias": SamplingParams(logit_bias={0: 2.0, 3: -1.0}),
    # The bias lands before the repetition penalty: token 3 goes -1 -> +2 -> 2 / 1.5, not -1.5 + 3.
    "all": SamplingParams(
        frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.5, logit_bias={3: 3.0, 6: -100}
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_penalties_follow_their_definitions(name):
    params = CASES[name]
    logits = torch.tensor([LOGITS])
    assert apply_penalties(logits, sequence(params))
    expected = by_definition(LOGITS, PROMPT, OUTPUT, params)
    torch.testing.assert_close(logits[0], torch.tensor(expected), atol=1e-6, rtol=0)


def test_no_penalty_leaves_the_logits_alone():
    logits = torch.tensor([LOGITS])
    assert not apply_penalties(logits, sequence(SamplingParams(frequency_penalty=0, logit_bias={})))
    assert logits[0].tolist() == torch.tensor(LOGITS).tolist()


def test_each_verification_row_counts_the_proposals_before_it():
    params = CASES["all"]
    proposals = [3, 6]
    logits = torch.tensor([LOGITS] * 3)
    assert apply_penalties(logits, sequence(params, proposals))
    for i in range(3):
        expected = by_definition(LOGITS, PROMPT, OUTPUT + proposals[:i], params)
        torch.testing.assert_close(logits[i], torch.tensor(expected), atol=1e-6, rtol=0)


def test_a_tiny_repetition_penalty_still_samples():
    # 1e-300 is 0 in fp32: seen positive logits go to +inf, and a small temperature would make NaNs.
    params = SamplingParams(repetition_penalty=1e-300, temperature=1e-4, max_tokens=1)
    logits = torch.tensor([LOGITS])
    apply_penalties(logits, sequence(params))
    probs = probabilities(logits, params)
    assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1)
    assert sample_rows(logits, params, torch.Generator().manual_seed(0))[0] in (2, 5, 7)  # the +inf ones


def penalized_greedy(hf_model, prompt: list[int], n: int, params: SamplingParams) -> list[int]:
    """transformers, one full forward per token, with its own repetition-penalty processor and the
    OpenAI penalties applied to the raw logits by definition."""
    from transformers import RepetitionPenaltyLogitsProcessor

    ids = list(prompt)
    for _ in range(n):
        with torch.inference_mode():
            logits = hf_model(torch.tensor([ids])).logits[0, -1:].float()
        if params.repetition_penalty != 1:
            logits = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(torch.tensor([ids]), logits)
        output = torch.tensor(ids[len(prompt) :], dtype=torch.long)
        counts = torch.bincount(output, minlength=logits.shape[-1]).float()
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize(
    "settings",
    [
        {"frequency_penalty": 1.0},
        {"presence_penalty": 1.5},
        {"repetition_penalty": 1.3},
        {"frequency_penalty": 0.4, "presence_penalty": 0.4, "repetition_penalty": 1.2},
    ],
)
def test_greedy_with_penalties_decodes_as_transformers_does(llm, hf_model, hf_greedy, settings):
    prompt = llm.tokenizer.encode("Repeat after me: the cat, the cat, the cat, the cat,")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, **settings)
    plain = llm.tokenizer.encode(PROMPTS[0])
    penalized, other = llm.generate([prompt, plain], [params, SamplingParams(max_tokens=8, temperature=0)])
    assert penalized.token_ids == penalized_greedy(hf_model, prompt, 12, params)
    assert penalized.token_ids != hf_greedy(tuple(prompt), 12)  # the penalty did change the answer
    assert other.token_ids == hf_greedy(tuple(plain), 8)  # and nothing else in the batch


def test_logit_bias_makes_greedy_pick_the_biased_token(llm):
    [target] = llm.tokenizer.encode(" banana")
    ids = llm.tokenizer.encode(PROMPTS[1])
    [out] = llm.generate([ids], SamplingParams(max_tokens=4, temperature=0, logit_bias={target: 100.0}))
    assert out.token_ids == [target] * 4
