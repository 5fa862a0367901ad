"""Token-based vs request-based vs self-hosted cost, from pricing models (llmopt/pricing.toml, package data).

token-based:   cost(request) = prompt_tokens * input_price + output_tokens * output_price
request-based: cost(request) = a flat price
gpu-hour:      cost(request) = price_per_hour / 3600 / (requests per second the server sustained)
Break-even: the prompt length above which a flat request price is cheaper than a token price, at a
given output length: (flat - output * output_price) / input_price.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmopt.files import read_toml

DEFAULT_PRICING = Path(__file__).with_name("pricing.toml")
KINDS = ("token", "request", "gpu-hour")


@dataclass
class PricingModel:
    name: str
    kind: str
    input_per_1m: float = 0.0
    output_per_1m: float = 0.0
    per_request: float = 0.0
    per_hour: float = 0.0
    source: str = ""
    date: str = ""

    def cost_per_request(
        self, prompt_tokens: float, output_tokens: float, request_throughput: float | None = None
    ) -> float | None:
        """Dollars for one request; None for a gpu-hour model without a measured throughput."""
        if self.kind == "token":
            return (prompt_tokens * self.input_per_1m + output_tokens * self.output_per_1m) / 1e6
        if self.kind == "request":
            return self.per_request
        if not request_throughput:
            return None
        return self.per_hour / 3600 / request_throughput

    def break_even_prompt_tokens(self, flat_per_request: float, output_tokens: float) -> float | None:
        """Prompt length above which `flat_per_request` is cheaper than this token price (None: never
        for a token model without an input price; 0: the flat price is cheaper at any length)."""
        if self.kind != "token" or self.input_per_1m <= 0:
            return None
        return max(
            0.0, (flat_per_request - output_tokens * self.output_per_1m / 1e6) * 1e6 / self.input_per_1m
        )


def load_pricing(path: Path | None = None) -> list[PricingModel]:
    path = path or DEFAULT_PRICING
    entries = read_toml(path, "pricing file").get("model", [])
    models = []
    for entry in entries:
        try:
            model = PricingModel(**entry)
        except TypeError as exc:
            raise ValueError(f"{path}: bad entry {entry.get('name', '?')}: {exc}") from None
        if model.kind not in KINDS:
            raise ValueError(f"{path}: {model.name}: kind must be one of {', '.join(KINDS)}")
        models.append(model)
    if not models:
        raise ValueError(f"{path} holds no [[model]] entries")
    return models


def cost_table(
    models: list[PricingModel],
    prompt_tokens: float,
    output_tokens: float,
    requests: int = 1000,
    request_throughput: float | None = None,
) -> list[dict]:
    """One row per pricing model: cost per request, per 1M output tokens, per 1,000 requests, for
    `requests` requests, and, for token models, the break-even prompt length against each flat price."""
    flat = [m for m in models if m.kind == "request"]
    rows = []
    for m in models:
        per_request = m.cost_per_request(prompt_tokens, output_tokens, request_throughput)
        row = {
            "name": m.name,
            "kind": m.kind,
            "per_request": per_request,
            "per_1m_output_tokens": per_request / output_tokens * 1e6
            if per_request is not None and output_tokens
            else None,
            "per_1k_requests": per_request * 1000 if per_request is not None else None,
            "total": per_request * requests if per_request is not None else None,
            "source": m.source,
            "date": m.date,
        }
        if m.kind == "token":
            row["break_even_prompt_tokens"] = {
                f.name: m.break_even_prompt_tokens(f.per_request, output_tokens) for f in flat
            }
        rows.append(row)
    return rows
