"""Log-probabilities of tokens, as the engine hands them out with a request's outputs.

They are the model's own distribution (vLLM's default `raw_logprobs` mode): the log-softmax of the
logits exactly as the model produced them, before logit_bias, penalties, a grammar mask, the
min_tokens ban, temperature, top-k, top-p or min-p change anything. So they do not depend on how a
request samples, and a prompt scored with echo gets the same numbers whatever its sampling settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# OpenAI's bound on top_logprobs (chat); the legacy completions API allows 5.
MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One token's log-probability and the most likely tokens at its position."""

    token_id: int
    logprob: float | None  # None only for a prompt's first token: nothing before it predicts it
    top: list[tuple[int, float]] | None  # (token id, logprob), most likely first; None with logprob None
    rank: int | None = None  # 1 + how many tokens are likelier (vLLM's rank); None with logprob None


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """The records of `token_ids`, where row i of `logits` [len(token_ids), vocab] is the distribution
    token i was drawn from, each with its `num_top` most likely tokens."""
    assert logits.shape[0] == len(token_ids), "one logits row per token"
    if not token_ids:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    rows = torch.arange(len(token_ids))
    chosen_values = logprobs[rows, torch.tensor(token_ids, dtype=torch.long)]
    chosen = chosen_values.tolist()
    ranks = ((logprobs > chosen_values[:, None]).sum(dim=-1) + 1).tolist()
    if num_top > 0:
        top = torch.topk(logprobs, num_top, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
    else:
        tops = [[] for _ in token_ids]
    return [TokenLogprob(t, c, k, r) for t, c, k, r in zip(token_ids, chosen, tops, ranks)]


def first_prompt_token(token_id: int) -> TokenLogprob:
    """The record of a prompt's first token, which has no logprob (OpenAI and vLLM return null)."""
    return TokenLogprob(token_id, None, None)
