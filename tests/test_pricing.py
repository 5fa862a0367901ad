"""Cost arithmetic against hand-computed cases; break-even against a brute-force scan."""

from pathlib import Path

import pytest

from llmopt.pricing import PricingModel, cost_table, load_pricing

TOKEN = PricingModel("tok", "token", input_per_1m=3.0, output_per_1m=15.0)
FLAT = PricingModel("flat", "request", per_request=0.04)
GPU = PricingModel("gpu", "gpu-hour", per_hour=2.0)


def test_token_request_and_gpu_hour_costs_by_hand():
    # 8,000 prompt + 500 output tokens: 8000 * 3 / 1e6 + 500 * 15 / 1e6 = 0.024 + 0.0075
    assert TOKEN.cost_per_request(8000, 500) == pytest.approx(0.0315)
    assert FLAT.cost_per_request(8000, 500) == 0.04
    # $2/hour at 4 requests/s: 2 / 3600 / 4
    assert GPU.cost_per_request(8000, 500, request_throughput=4) == pytest.approx(2 / 14400)
    assert GPU.cost_per_request(8000, 500) is None


def test_cost_table_rows():
    rows = {
        r["name"]: r
        for r in cost_table([TOKEN, FLAT, GPU], 8000, 500, requests=1_000_000, request_throughput=4)
    }
    assert rows["tok"]["per_1m_output_tokens"] == pytest.approx(0.0315 / 500 * 1e6)
    assert rows["tok"]["per_1k_requests"] == pytest.approx(31.5)
    assert rows["tok"]["total"] == pytest.approx(31_500)
    assert rows["flat"]["total"] == pytest.approx(40_000)
    # Break-even: 0.04 = P * 3e-6 + 500 * 15e-6  ->  P = (0.04 - 0.0075) / 3e-6 = 10,833.3
    assert rows["tok"]["break_even_prompt_tokens"]["flat"] == pytest.approx(10_833.33, rel=1e-4)


@pytest.mark.parametrize("output_tokens", [0, 100, 500, 2000, 3000])
def test_break_even_matches_a_brute_force_scan(output_tokens):
    analytic = TOKEN.break_even_prompt_tokens(FLAT.per_request, output_tokens)
    # The first whole prompt length at which the flat price is strictly cheaper.
    scan = next(p for p in range(0, 100_000) if FLAT.per_request < TOKEN.cost_per_request(p, output_tokens))
    if analytic == 0:
        assert scan == 0
    else:
        assert scan - 1 <= analytic < scan


def test_shipped_pricing_file_loads_with_sources(tmp_path: Path):
    models = load_pricing()
    assert {m.kind for m in models} == {"token", "request", "gpu-hour"}
    assert all(m.source and m.date for m in models)
    bad = tmp_path / "p.toml"
    bad.write_text('[[model]]\nname = "x"\nkind = "barter"\n')
    with pytest.raises(ValueError, match="kind must be one of"):
        load_pricing(bad)
