"""The price of one request under each kind, against hand-computed cases, and the bundled price list:
every entry with its source and date, every provider of the project's notes, open models priced by
several providers."""

import re
from pathlib import Path

import pytest

from llmopt.pricing import PricingModel, Usage, load_pricing

TOKEN = PricingModel("tok", "token", input_per_1m=3.0, output_per_1m=15.0)
CACHING = PricingModel(
    "cache", "token", input_per_1m=3.0, cached_input_per_1m=0.30, cache_write_per_1m=3.75, output_per_1m=15.0
)
FLAT = PricingModel("flat", "request", per_request=0.04)
PRO = PricingModel(
    "pro", "plan", per_month=80, requests_per_day=1000, requests_per_minute=30, max_input_tokens=16384,
    max_output_tokens=4096,
)  # fmt: skip
GPU = PricingModel("gpu", "gpu-hour", per_hour=2.0)


def test_token_prices_by_hand():
    # 8,000 prompt + 500 output tokens: 8000 * 3 / 1e6 + 500 * 15 / 1e6 = 0.024 + 0.0075
    assert TOKEN.request_cost(Usage(8000, 500)) == pytest.approx(0.0315)
    # Without a cached price, cached tokens cost the input price.
    assert TOKEN.request_cost(Usage(8000, 500, cached_tokens=6000)) == pytest.approx(0.0315)
    # 10,000 prompt = 6,000 read from the cache + 4,000 written to it, 500 output:
    # (6000 * 0.30 + 4000 * 3.75 + 500 * 15) / 1e6 = (1800 + 15000 + 7500) / 1e6
    assert CACHING.request_cost(Usage(10_000, 500, 6000, 4000)) == pytest.approx(0.0243)
    # 2,000 of them plain input: (2000 * 3 + 6000 * 0.3 + 2000 * 3.75 + 500 * 15) / 1e6
    assert CACHING.request_cost(Usage(10_000, 500, 6000, 2000)) == pytest.approx(0.0228)
    # A prompt token half read from the cache, half written: (0.5 * 0.30 + 0.5 * 3.75) / 1e6
    assert CACHING.input_price(0.5, writes=True) == pytest.approx(2.025e-6)
    assert CACHING.input_price(0.5) == pytest.approx(1.65e-6)


def test_flat_plan_and_gpu_hour_prices_by_hand():
    assert FLAT.request_cost(Usage(100_000, 5000)) == 0.04
    # $80 a month for 1,000 requests a day over 30 days, all used: 80 / 30,000
    assert PRO.request_cost(Usage(100, 10)) == pytest.approx(80 / 30_000)
    # a tenth of the quota used: ten times the price per request
    assert PRO.request_cost(Usage(100, 10), utilisation=0.1) == pytest.approx(80 / 3_000)
    with pytest.raises(ValueError, match="utilisation"):
        PRO.plan_request_price(0)
    # $2/hour at 4 requests/s: 2 / 3600 / 4
    assert GPU.request_cost(Usage(8000, 500), request_throughput=4) == pytest.approx(2 / 14400)
    assert GPU.request_cost(Usage(8000, 500)) is None


def test_a_plan_refuses_requests_over_its_caps():
    assert PRO.refusal(Usage(16384, 4096)) is None
    assert PRO.refusal(Usage(16385, 10)) == "16,385 prompt tokens > the 16,384 cap"
    assert PRO.refusal(Usage(100, 4097)) == "4,097 output tokens > the 4,096 cap"
    assert TOKEN.refusal(Usage(10**7, 10**6)) is None


NOTES_PROVIDERS = {
    # token-based
    "Together AI", "Fireworks AI", "OpenRouter", "Replicate", "Anyscale Endpoints", "DeepInfra", "Groq",
    "DeepSeek API", "OpenAI", "Anthropic",
    # request-based and plans
    "Oxlo.ai", "GitHub Copilot", "Perplexity",
    # GPU hours
    "Lambda", "RunPod Secure Cloud", "AWS", "GCP",
}  # fmt: skip


def test_every_bundled_entry_has_a_source_url_and_a_date():
    models = load_pricing()
    assert {m.kind for m in models} == {"token", "request", "plan", "gpu-hour"}
    for m in models:
        assert m.source.startswith("https://"), m.name
        # SkyPilot's catalog is the one source the notes could not date: said so, never guessed
        undated = m.date == "undated" and "skypilot-catalog" in m.source
        assert undated or re.fullmatch(r"\d{4}-\d{2}-\d{2}", m.date), (m.name, m.date)
    assert len({m.name for m in models}) == len(models)


def test_the_bundled_list_has_every_provider_and_shared_open_models():
    models = load_pricing()
    assert {m.provider for m in models} == NOTES_PROVIDERS
    token = [m for m in models if m.kind == "token"]
    providers: dict[str, set[str]] = {}
    for m in token:
        if m.open_model:
            providers.setdefault(m.open_model, set()).add(m.provider)
    assert providers["Llama 3.3 70B"] == {"Together AI", "Fireworks AI", "DeepInfra", "Groq"}
    assert providers["Llama 3.1 8B"] == {"Together AI", "Fireworks AI"}
    assert providers["DeepSeek V3"] == {"Together AI", "Fireworks AI", "DeepSeek API"}
    assert providers["Qwen3 32B"] == {"DeepInfra", "Groq"}
    oxlo = {m.name: m for m in models if m.provider == "Oxlo.ai"}
    assert oxlo["oxlo/pro"].plan_request_price() == pytest.approx(0.0027, abs=5e-5)  # the notes' figure
    assert oxlo["oxlo/premium"].plan_request_price() == pytest.approx(0.0023, abs=5e-5)


@pytest.mark.parametrize(
    "entry, message",
    [
        ('name = "x"\nkind = "barter"', "kind must be one of"),
        ('name = "x"\nkind = "token"\ninput_per_1m = "cheap"', "input_per_1m must be a number"),
        ('name = "x"\nkind = "token"\noutput_per_1m = -1', "output_per_1m cannot be negative"),
        ('name = "x"\nkind = "plan"\nper_month = 10', "a plan needs requests_per_day"),
        ('name = "x"\nkind = "request"\nprice = 1', "unknown field"),
        ('kind = "request"', "bad entry"),
    ],
)
def test_a_bad_pricing_entry_names_the_file_and_the_problem(tmp_path: Path, entry: str, message: str):
    bad = tmp_path / "p.toml"
    bad.write_text(f"[[model]]\n{entry}\n")
    with pytest.raises(ValueError, match=message) as info:
        load_pricing(bad)
    assert str(bad) in str(info.value)


def test_a_users_own_entry_needs_no_source(tmp_path: Path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[model]]\nname = "deal"\nkind = "request"\nper_request = 0.5\n')
    [model] = load_pricing(mine)
    assert model.request_cost(Usage(1, 1)) == 0.5
