"""Conversations under token and per-request prices: hand-computed costs, quadratic against linear
growth, and every break-even point against a brute-force scan of the same arithmetic."""

from __future__ import annotations

import pytest

from llmopt.cost.break_even import (
    break_even_prompt_tokens,
    break_even_turns,
    break_evens,
    conversation_cost,
    max_turns,
)
from llmopt.cost.conversation_shape import ConversationShape
from llmopt.pricing import PricingModel

LLAMA = PricingModel("llama", "token", input_per_1m=0.88, output_per_1m=0.88)
CACHED = PricingModel("cached", "token", input_per_1m=0.28, cached_input_per_1m=0.028, output_per_1m=0.42)
WRITES = PricingModel(
    "writes", "token", input_per_1m=1.0, cached_input_per_1m=0.1, cache_write_per_1m=1.25, output_per_1m=5.0
)
PRO = PricingModel(
    "pro", "plan", per_month=80, requests_per_day=1000, max_input_tokens=16384, max_output_tokens=4096
)


def summed(token: PricingModel, shape: ConversationShape) -> float:
    """A conversation's cost as the sum of its requests' prices (what the closed form must equal)."""
    return sum(token.request_cost(u) for u in shape.usages())


def test_turn_prompts_replay_the_history():
    shape = ConversationShape(100, 50, turns=3)
    assert [u.prompt_tokens for u in shape.usages()] == [100, 250, 400]
    assert [u.output_tokens for u in shape.usages()] == [50, 50, 50]


def test_conversation_costs_by_hand():
    # 3 turns of 100 new + 50 output tokens: prompts 100 + 250 + 400 = 750, output 150, at $1 / $2 per 1M
    token = PricingModel("t", "token", input_per_1m=1.0, output_per_1m=2.0)
    shape = ConversationShape(100, 50, turns=3)
    assert conversation_cost(token, shape) == pytest.approx((750 + 300) / 1e6)
    assert summed(token, shape) == pytest.approx((750 + 300) / 1e6)  # request by request, the same
    # Half of every prompt read from the cache at $0.1, the other half written at the input price:
    # 375 * 0.1 + 375 * 1.0 + 150 * 2 per 1M
    cached = PricingModel("c", "token", input_per_1m=1.0, cached_input_per_1m=0.1, output_per_1m=2.0)
    assert conversation_cost(cached, ConversationShape(100, 50, 3, 0.5)) == pytest.approx(712.5 / 1e6)


@pytest.mark.parametrize("model", [LLAMA, CACHED, WRITES])
@pytest.mark.parametrize("cached_fraction", [0.0, 0.3, 0.9])
def test_token_cost_grows_with_the_square_of_the_turns(model, cached_fraction):
    costs = [conversation_cost(model, ConversationShape(700, 120, t, cached_fraction)) for t in range(1, 12)]
    for t, cost in enumerate(costs, 1):
        assert cost == pytest.approx(summed(model, ConversationShape(700, 120, t, cached_fraction)))
    second = [costs[i + 1] - 2 * costs[i] + costs[i - 1] for i in range(1, len(costs) - 1)]
    assert all(d > 0 for d in second)
    assert max(second) == pytest.approx(min(second))  # a constant second difference: a parabola
    # and a price per request grows linearly: a zero second difference
    flat = [t * PRO.plan_request_price() for t in range(1, 12)]
    assert [flat[i + 1] - 2 * flat[i] + flat[i - 1] for i in range(1, 10)] == pytest.approx(
        [0] * 9, abs=1e-15
    )


SHAPES = [
    ConversationShape(2000, 300),
    ConversationShape(500, 100, cached_fraction=0.5),
    ConversationShape(8000, 50, cached_fraction=0.95),
    ConversationShape(120, 900),
    ConversationShape(0, 200),
]


def brute_turns(token: PricingModel, price: float, shape: ConversationShape, limit: int = 100_000):
    """The first whole number of turns at which `price` a request is strictly cheaper, by scanning turn
    by turn and adding up each turn's own price."""
    total = 0.0
    for t in range(1, limit):
        total += token.request_cost(shape.turn_usage(t))
        if t * price < total:
            return t
    return None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("token", [LLAMA, CACHED, WRITES])
@pytest.mark.parametrize("price", [80 / 30_000, 0.04, 0.005, 0.0001])
def test_break_even_turns_match_a_brute_force_scan(token, price, shape):
    assert break_even_turns(token, price, shape) == brute_turns(token, price, shape)


@pytest.mark.parametrize("turns", [1, 2, 5, 12])
@pytest.mark.parametrize("token", [LLAMA, CACHED, WRITES])
@pytest.mark.parametrize("price", [80 / 30_000, 0.04])
@pytest.mark.parametrize("output", [0, 100, 2000])
def test_break_even_prompt_length_matches_a_brute_force_scan(token, price, turns, output):
    shape = ConversationShape(0, output, turns, cached_fraction=0.4)
    analytic = break_even_prompt_tokens(token, price, shape)

    def flat_cheaper(p: int) -> bool:
        s = ConversationShape(p, output, turns, 0.4)
        return turns * price < summed(token, s)

    # The first whole prompt length at which the price per request is strictly cheaper: a scan by
    # thousands, then one by one over the last thousand (cheaper stays cheaper as prompts grow).
    coarse = next(p for p in range(0, 10**8, 1000) if flat_cheaper(p))
    scan = next(p for p in range(max(0, coarse - 999), coarse + 1) if flat_cheaper(p))
    if analytic == 0:
        assert scan == 0
    else:
        assert scan - 1 <= analytic < scan


def test_break_even_prompt_length_for_one_request_by_hand():
    # 0.04 = P * 3e-6 + 500 * 15e-6  ->  P = (0.04 - 0.0075) / 3e-6 = 10,833.3
    token = PricingModel("tok", "token", input_per_1m=3.0, output_per_1m=15.0)
    assert break_even_prompt_tokens(token, 0.04, ConversationShape(0, 500)) == pytest.approx(
        10_833.33, rel=1e-6
    )


def test_a_cached_input_discount_moves_the_break_even_later():
    shape = ConversationShape(2000, 300)
    plain = break_even_turns(CACHED, PRO.plan_request_price(), shape)
    cached = break_even_turns(CACHED, PRO.plan_request_price(), ConversationShape(2000, 300, 1, 0.9))
    assert plain is not None and cached is not None and cached > plain
    # without a cached price nothing moves: the cached share costs the input price
    assert break_even_turns(LLAMA, 0.0027, ConversationShape(2000, 300, 1, 0.9)) == break_even_turns(
        LLAMA, 0.0027, shape
    )


@pytest.mark.parametrize(
    "shape", [ConversationShape(2000, 300), ConversationShape(100, 4096), ConversationShape(20_000, 10)]
)
def test_max_turns_matches_a_scan_of_the_caps(shape):
    fits = [t for t in range(1, 200) if all(PRO.refusal(u) is None for u in shape.with_turns(t).usages())]
    assert max_turns(PRO, shape) == (max(fits) if fits else 0)
    assert max_turns(LLAMA, shape) is None
    assert max_turns(PRO, ConversationShape(100, 5000)) == 0


def test_break_evens_pair_every_token_price_with_every_price_per_request():
    gpu = PricingModel("gpu", "gpu-hour", per_hour=3.6)
    rows = break_evens([LLAMA, CACHED, PRO, gpu], ConversationShape(2000, 300, 10), request_throughput=1.0)
    assert {(b.token.name, b.flat.name) for b in rows} == {
        ("llama", "pro"), ("cached", "pro"), ("llama", "gpu"), ("cached", "gpu")
    }  # fmt: skip
    pro = next(b for b in rows if b.flat.name == "pro" and b.token.name == "llama")
    assert pro.per_request == pytest.approx(80 / 30_000) and pro.max_turns == 7
    # at $0.00267 a request against $0.88 per 1M tokens: 2 * (r - beta) / alpha - 1 with alpha = 2300 *
    # 0.88e-6 and beta = 0: 1.635..., so from 2 turns; 7 turns fit under the 16K cap
    assert pro.turns == 2 and pro.reachable
    assert [b.per_request for b in rows if b.flat.name == "gpu"] == [pytest.approx(0.001)] * 2
    assert break_evens([LLAMA, gpu], ConversationShape(10, 10)) == []  # no throughput: no GPU price
