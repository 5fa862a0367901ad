"""Checking proposed tokens against the target model's logits, keeping its distribution exactly."""

from __future__ import annotations

import torch

from llmopt.engine.sampler import ban_stop_tokens, greedy_tokens, probabilities
from llmopt.engine.sequence import Sequence


def verify(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    seq: Sequence,
    stop_ids: set[int],
    greedy: list[int] | None = None,
) -> tuple[list[int], int]:
    """Check proposed tokens against the target's logits [k + 1, vocab] (row i predicts the token after
    proposal i - 1). `draft_probs` [k, vocab] are the draft's sampling distributions (None: the
    proposals were certain, as n-gram lookups are). `greedy`: the rows' argmax if the caller took it
    already (after banning stop tokens as here). Return the tokens to append (accepted ones, then a
    corrected or bonus token) and how many proposals were accepted."""
    params = seq.params
    ban_stop_tokens(logits, stop_ids, params, seq.num_output_tokens)
    if params.greedy:
        target = greedy if greedy is not None else greedy_tokens(logits)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == target[accepted]:
            accepted += 1
        return draft[:accepted] + [target[accepted]], accepted
    p = probabilities(logits, params)
    out: list[int] = []
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand((), generator=seq.generator))
        if u < min(1.0, float(p[i, x]) / q_x):
            out.append(x)
            continue
        # Rejected: sample from the part of p that q does not cover.
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0
        else:
            residual = (p[i] - draft_probs[i]).clamp_min(0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p[i]
        out.append(int(torch.multinomial(residual, 1, generator=seq.generator)))
        return out, i
    out.append(int(torch.multinomial(p[len(draft)], 1, generator=seq.generator)))
    return out, len(draft)
