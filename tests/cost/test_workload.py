"""Workloads priced under every kind: hand-computed bills, a plan's caps and rate cap, and the cheapest
pricing with the factor it wins by."""

from __future__ import annotations

import pytest

from llmopt.cost.conversation_shape import ConversationShape
from llmopt.cost.workload import Workload, cheapest, cheapest_per_open_model, price_workload, rank
from llmopt.pricing import PricingModel, Usage

A = PricingModel("a", "token", open_model="M", input_per_1m=1.0, output_per_1m=2.0)
B = PricingModel("b", "token", open_model="M", input_per_1m=2.0, output_per_1m=4.0)
C = PricingModel("c", "token", input_per_1m=0.5, cached_input_per_1m=0.05, output_per_1m=1.0)
FLAT = PricingModel("flat", "request", per_request=0.01)
FREE = PricingModel("free", "plan", per_month=0, requests_per_day=60, max_input_tokens=8192)
PRO = PricingModel(
    "pro", "plan", per_month=80, requests_per_day=1000, requests_per_minute=30, max_input_tokens=16384
)
GPU = PricingModel("gpu", "gpu-hour", per_hour=3.6)


def test_a_bill_by_hand_with_cached_tokens():
    # two lone requests: 1,000 prompt (400 cached) + 100 output, and 3,000 prompt + 200 output
    w = Workload([[Usage(1000, 100, 400)], [Usage(3000, 200)]])
    p = price_workload(C, w)
    # (600 * 0.5 + 400 * 0.05 + 100 * 1.0) / 1e6 + (3000 * 0.5 + 200 * 1.0) / 1e6
    assert p.total == pytest.approx((300 + 20 + 100 + 1500 + 200) / 1e6)
    assert (p.requests, p.conversations, p.refused) == (2, 2, 0)
    assert p.per_request == pytest.approx(p.total / 2) and p.serves_all


def test_a_conversation_over_a_plans_cap_is_not_servable_on_it():
    # 5 turns of 4,000 new + 500 output tokens: prompts 4,000, 8,500, 13,000, 17,500, 22,000
    w = Workload([ConversationShape(4000, 500, 5).usages()])
    p = price_workload(PRO, w)
    assert (p.requests, p.refused, p.conversations) == (3, 2, 0)
    assert p.refusal == "17,500 prompt tokens > the 16,384 cap"
    assert p.total == pytest.approx(3 * 80 / 30_000) and p.per_conversation is None and not p.serves_all
    # at a tenth of the quota each request costs ten times as much
    assert price_workload(PRO, w, utilisation=0.1).total == pytest.approx(3 * 80 / 3_000)


def test_gpu_hours_need_a_throughput_and_plans_note_their_rate_cap():
    w = Workload([[Usage(10, 10)]] * 4, request_throughput=2.0, requests_per_minute=120)
    assert price_workload(GPU, w).total == pytest.approx(4 * 3.6 / 3600 / 2.0)
    assert price_workload(PRO, w).notes == ["120 requests/min is over its 30/min cap"]
    unpriced = price_workload(GPU, Workload([[Usage(10, 10)]]))
    assert unpriced.total is None and not unpriced.serves_all


def test_the_cheapest_pricing_and_by_how_much():
    # one request of 1,000 + 100 tokens: a $0.0012, b $0.0024, c $0.0006, flat $0.01
    w = Workload([[Usage(1000, 100)]], request_throughput=None)
    ranked = rank([A, B, C, FLAT, FREE, GPU], w)
    assert [p.model.name for p in ranked] == ["free", "c", "a", "b", "flat", "gpu"]
    answer = cheapest(ranked)
    assert answer.best.model.name == "c" and answer.runner_up.model.name == "a"
    assert answer.factor == pytest.approx(2.0)
    assert [p.model.name for p in answer.free] == ["free"]  # free, but named apart: it costs nothing
    per_model = cheapest_per_open_model(ranked)
    assert list(per_model) == ["M"] and per_model["M"].best.model.name == "a"
    assert per_model["M"].factor == pytest.approx(2.0)


def test_a_pricing_that_refuses_requests_ranks_after_those_that_serve_all():
    w = Workload([[Usage(20_000, 10)]])
    ranked = rank([PRO, B], w)
    assert [p.model.name for p in ranked] == ["b", "pro"]
    assert cheapest(rank([PRO], w)) is None
