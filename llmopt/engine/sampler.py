"""Turning logits into tokens: greedy, or temperature / min-p / top-k / top-p with a per-request generator."""

from __future__ import annotations

import torch

from llmopt.engine.sampling_params import SamplingParams


def ban_stop_tokens(
    logits: torch.Tensor, stop_ids: set[int], params: SamplingParams, num_output: int
) -> None:
    """Rows of `logits` are consecutive output positions starting at `num_output`: while fewer than
    `min_tokens` tokens have been generated, stopping tokens cannot be sampled."""
    allowed_from = params.min_tokens - num_output
    if allowed_from > 0:
        banned = list(stop_ids | set(params.stop_token_ids))
        logits[:allowed_from, banned] = float("-inf")


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature, then min-p, top-k and top-p (vLLM's
    order)."""
    # Capped at fp32's largest value: a logit a tiny repetition_penalty sent to +inf (or a huge one over a
    # small temperature) would make the softmax NaN; capped, the largest logits share the mass.
    logits = (logits / params.temperature).clamp(max=torch.finfo(logits.dtype).max)
    vocab = logits.shape[-1]
    if params.min_p > 0:  # drop what is less likely than min_p x the most likely token
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens before it already cover top_p; the most likely token always stays.
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= params.top_p
        drop[..., 0] = False  # a top_p below float32's smallest value rounds to 0 and would drop it too
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits.softmax(dim=-1)


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """The most likely token of each row of `logits` [rows, vocab], the first one on a tie as argmax.
    torch.max is 3x faster than torch.argmax over a 49k vocabulary on this CPU (0.6 vs 1.8 ms for 16
    rows), and one call for a batch's rows instead of one per sequence saves the rest."""
    return logits.max(dim=-1).indices.tolist()


def sample_rows(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """One token per row of `logits` [rows, vocab]."""
    if params.greedy:
        return greedy_tokens(logits)
    probs = probabilities(logits, params)
    if not sampleable(probs):
        raise ValueError("no token can be sampled: the logits are not finite or every token is banned")
    return torch.multinomial(probs, 1, generator=generator).squeeze(1).tolist()


def sampleable(probs: torch.Tensor) -> bool:
    """False for a row with no finite, positive mass (every token banned, or NaN logits), which
    multinomial would fail on."""
    return bool(torch.isfinite(probs).all()) and not bool((probs.sum(dim=-1) <= 0).any())
