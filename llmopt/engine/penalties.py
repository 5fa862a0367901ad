"""Logits changes that depend on what a request has seen or asked for: `logit_bias` (OpenAI), vLLM's
`repetition_penalty`, OpenAI's `frequency_penalty` and `presence_penalty`. They run first, before a
grammar mask, the min_tokens ban and sampling, in vLLM's order: the bias, then repetition, then
frequency and presence."""

from __future__ import annotations

import torch

from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> bool:
    """Change `seq`'s logits rows [1 + proposals, vocab] in place; return whether anything changed (a
    greedy pick taken before must then be taken again). Row i follows the output so far and the first
    i proposed tokens, so a verification row is penalized as if those proposals had been sampled: what
    the verifier accepts is what sampling one token at a time would have produced.

    - logit_bias: each value is added to its token's logit;
    - repetition_penalty p (vLLM and transformers): the logit of every token seen in the prompt or the
      output is divided by p when positive and multiplied by p when negative;
    - frequency_penalty f and presence_penalty r (OpenAI): logit -= f * count + r * (count > 0), where
      count is how often the token occurs in the output (the prompt does not count).
    """
    params = seq.params
    if not params.has_penalties:
        return False
    assert logits.shape[0] == 1 + len(seq.spec_token_ids), "one row per proposal, and one more"
    vocab = logits.shape[-1]
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        logits[:, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)
    output = torch.tensor(seq.token_ids[seq.num_prompt_tokens :], dtype=torch.long)
    counts = torch.bincount(output, minlength=vocab).to(logits.dtype)
    seen = None
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        seen[torch.tensor(seq.token_ids[: seq.num_prompt_tokens], dtype=torch.long)] = True
    for i, row in enumerate(logits):
        if i > 0:  # this row comes after proposal i - 1
            proposed = seq.spec_token_ids[i - 1]
            counts[proposed] += 1
            if seen is not None:
                seen[proposed] = True
        penalize(row, counts, seen, params)
    return True


def penalize(
    row: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor | None, params: SamplingParams
) -> None:
    """The penalties on one row [vocab], given the output's token counts and (for repetition_penalty)
    the tokens seen in the prompt or the output."""
    if seen is not None:
        p = params.repetition_penalty
        # A tiny p sends a positive logit to +inf in fp32; the sampler keeps such rows finite.
        row.copy_(torch.where(seen, torch.where(row > 0, row / p, row * p), row))
    if params.frequency_penalty:
        row -= params.frequency_penalty * counts
    if params.presence_penalty:
        row -= params.presence_penalty * (counts > 0).to(row.dtype)
