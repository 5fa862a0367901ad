"""Where a price per request (a flat price, a plan's share of its fee, a GPU hour at the measured
throughput) starts to beat a token price, for conversations of a given shape.

Under a token price turn k of a conversation costs alpha * k + beta dollars, since its prompt replays
k * (prompt + output) - output tokens: with u the price of a prompt token (caching included) and p_out
that of an output token, alpha = (prompt + output) * u and beta = output * (p_out - u). T turns cost
alpha * T (T + 1) / 2 + beta * T: the square of the turns. At r dollars a request they cost r * T, so r
is strictly cheaper from the first T with alpha * (T + 1) / 2 + beta > r, and, at T turns, for new
prompts longer than (r - output * (p_out - u)) / (u * (T + 1) / 2) - output tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmopt.cost.conversation_shape import ConversationShape
from llmopt.pricing import PricingModel, Usage


def turn_cost_line(token: PricingModel, shape: ConversationShape) -> tuple[float, float]:
    """(alpha, beta): turn k of `shape` costs alpha * k + beta dollars under the token model."""
    u = token.input_price(shape.cached_fraction, shape.writes)
    p_out = token.output_per_1m / 1e6
    o = shape.output_tokens
    return (shape.prompt_tokens + o) * u, o * (p_out - u)


def conversation_cost(token: PricingModel, shape: ConversationShape) -> float:
    """Dollars for one conversation of `shape` under a token model, in closed form."""
    alpha, beta = turn_cost_line(token, shape)
    t = shape.turns
    return alpha * t * (t + 1) / 2 + beta * t


def flat_price(model: PricingModel, utilisation: float = 1.0, request_throughput: float | None = None):
    """Dollars per request of a request, plan or gpu-hour model (None: a GPU hour without throughput)."""
    assert model.kind != "token"
    return model.request_cost(Usage(0, 0), utilisation, request_throughput)


def break_even_turns(token: PricingModel, per_request: float, shape: ConversationShape) -> int | None:
    """The fewest turns at which conversations of `shape` (its turns aside) cost strictly less at
    `per_request` dollars a request than under `token`; None when they never do."""
    alpha, beta = turn_cost_line(token, shape)
    if alpha <= 0:  # every turn costs beta under the token price, whatever the history
        return 1 if beta > per_request else None
    x = 2 * (per_request - beta) / alpha - 1
    return max(1, math.floor(x) + 1)


def break_even_prompt_tokens(
    token: PricingModel, per_request: float, shape: ConversationShape
) -> float | None:
    """New prompt tokens per turn above which `per_request` dollars a request beats `token` for a
    conversation of `shape.turns` turns (0: at any length; None: never, the token model's input is free)."""
    u = token.input_price(shape.cached_fraction, shape.writes)
    if u <= 0:
        return None
    o = shape.output_tokens
    p_out = token.output_per_1m / 1e6
    return max(0.0, (per_request - o * (p_out - u)) / (u * (shape.turns + 1) / 2) - o)


def max_turns(plan: PricingModel, shape: ConversationShape) -> int | None:
    """The most turns of `shape` that a model's per-request token caps let through (None: no cap)."""
    if plan.max_output_tokens is not None and shape.output_tokens > plan.max_output_tokens:
        return 0
    if plan.max_input_tokens is None:
        return None
    per_turn = shape.prompt_tokens + shape.output_tokens
    if per_turn <= 0:
        return None
    # turn k sends k * per_turn - output tokens; the last one allowed sends at most the cap
    return math.floor((plan.max_input_tokens + shape.output_tokens) / per_turn)


@dataclass
class BreakEven:
    """One token price against one price per request, for conversations of the shape asked about."""

    token: PricingModel
    flat: PricingModel
    per_request: float
    turns: int | None  # the fewest turns from which the price per request is cheaper
    turns_uncached: int | None  # the same without any cached input (what caching moves)
    prompt_tokens: float | None  # new tokens per turn above which it is cheaper, at the shape's turns
    max_turns: int | None  # the most turns its caps serve (None: no cap)

    @property
    def reachable(self) -> bool:
        """Whether the break-even turn is one the flat pricing can serve."""
        return self.turns is not None and (self.max_turns is None or self.turns <= self.max_turns)


def break_evens(
    models: list[PricingModel],
    shape: ConversationShape,
    utilisation: float = 1.0,
    request_throughput: float | None = None,
) -> list[BreakEven]:
    """Every token model against every request, plan and (with a throughput) gpu-hour model."""
    tokens = [m for m in models if m.kind == "token"]
    uncached = ConversationShape(shape.prompt_tokens, shape.output_tokens, shape.turns)
    out = []
    for flat in (m for m in models if m.kind != "token"):
        price = flat_price(flat, utilisation, request_throughput)
        if price is None:
            continue
        for token in tokens:
            out.append(
                BreakEven(
                    token,
                    flat,
                    price,
                    break_even_turns(token, price, shape),
                    break_even_turns(token, price, uncached),
                    break_even_prompt_tokens(token, price, shape),
                    max_turns(flat, shape),
                )
            )
    return out
