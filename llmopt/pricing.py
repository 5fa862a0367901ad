"""Pricing models (llmopt/pricing.toml, package data) and the price of one request under each kind.

token:    (uncached input * input + cached input * cached_input + cache writes * cache_write
           + output * output) / 1M
request:  a flat price per request, whatever its length
plan:     a monthly fee for a daily request quota: per_month / (requests_per_day * 30 * utilisation),
          where utilisation is the share of the quota used; a request over the plan's token caps cannot
          be served on it at all
gpu-hour: self-hosted: per_hour / 3600 / (requests per second the server sustains)

Pricing whole workloads (conversations, runs) and break-even points live in llmopt/cost/.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmopt.files import read_toml

DEFAULT_PRICING = Path(__file__).with_name("pricing.toml")
KINDS = ("token", "request", "plan", "gpu-hour")
DAYS_PER_MONTH = 30  # Oxlo's own "about $0.0027 per request at full use" of Pro: 80 / (1,000 * 30)
TEXT_FIELDS = {"name", "kind", "provider", "open_model", "source", "date", "note"}


@dataclass(frozen=True)
class Usage:
    """The tokens of one request as a provider bills them. `cached_tokens` and `cache_write_tokens` are
    parts of `prompt_tokens` (read from, and written to, the provider's prompt cache)."""

    prompt_tokens: float
    output_tokens: float
    cached_tokens: float = 0.0
    cache_write_tokens: float = 0.0

    def __post_init__(self) -> None:
        assert min(self.prompt_tokens, self.output_tokens, self.cached_tokens, self.cache_write_tokens) >= 0
        # rounding only: cached + written = prompt, computed as prompt - cached
        assert self.cached_tokens + self.cache_write_tokens <= self.prompt_tokens * (1 + 1e-9) + 1e-9, self


@dataclass(frozen=True)
class TokenSums:
    """The tokens of many requests added up, the bench's request records and bills (Usage) alike: the
    one sum the bench's summaries and the cost of a workload both take. No Usage, whose parts must fit
    its prompt: a server may say it cached more than the local tokenizer counted."""

    prompt_tokens: float = 0
    output_tokens: float = 0
    cached_tokens: float = 0
    cache_write_tokens: float = 0

    @classmethod
    def of(cls, requests: Iterable) -> TokenSums:
        """A record whose server did not say what it cached (None) adds none; a record writes none."""
        items = list(requests)
        return cls(
            sum(r.prompt_tokens for r in items),
            sum(r.output_tokens for r in items),
            sum(r.cached_tokens if r.cached_tokens is not None else 0 for r in items),
            sum(getattr(r, "cache_write_tokens", 0) for r in items),
        )


@dataclass
class PricingModel:
    name: str
    kind: str
    provider: str = ""
    open_model: str = ""  # the open-weights model served, named the same across providers
    input_per_1m: float = 0.0
    cached_input_per_1m: float | None = None  # None: cached tokens cost the input price
    cache_write_per_1m: float | None = None  # None: written tokens cost the input price
    output_per_1m: float = 0.0
    per_request: float = 0.0
    per_month: float = 0.0
    requests_per_day: int | None = None
    requests_per_minute: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    per_hour: float = 0.0
    source: str = ""
    date: str = ""
    note: str = ""

    def request_cost(
        self, usage: Usage, utilisation: float = 1.0, request_throughput: float | None = None
    ) -> float | None:
        """Dollars for one request; None for a gpu-hour model without a measured throughput. A plan's
        price is its share of the monthly fee when `utilisation` of the quota is used."""
        if self.kind == "token":
            return self._token_cost(usage)
        if self.kind == "request":
            return self.per_request
        if self.kind == "plan":
            return self.plan_request_price(utilisation)
        if not request_throughput:
            return None
        return self.per_hour / 3600 / request_throughput

    def _token_cost(self, usage: Usage) -> float:
        cached = self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m
        write = self.input_per_1m if self.cache_write_per_1m is None else self.cache_write_per_1m
        plain = usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
        dollars_per_1m = (
            plain * self.input_per_1m
            + usage.cached_tokens * cached
            + usage.cache_write_tokens * write
            + usage.output_tokens * self.output_per_1m
        )
        return dollars_per_1m / 1e6

    def plan_request_price(self, utilisation: float = 1.0) -> float:
        """A plan's fee spread over the requests made in a month at `utilisation` of its daily quota."""
        assert self.kind == "plan" and self.requests_per_day
        if not 0 < utilisation <= 1:
            raise ValueError(f"utilisation is the share of the quota used: 0 < u <= 1, not {utilisation}")
        return self.per_month / (self.requests_per_day * DAYS_PER_MONTH * utilisation)

    def refusal(self, usage: Usage) -> str | None:
        """Why this pricing cannot serve the request (a plan's per-request token caps), or None."""
        if self.max_input_tokens is not None and usage.prompt_tokens > self.max_input_tokens:
            return f"{usage.prompt_tokens:,.0f} prompt tokens > the {self.max_input_tokens:,} cap"
        if self.max_output_tokens is not None and usage.output_tokens > self.max_output_tokens:
            return f"{usage.output_tokens:,.0f} output tokens > the {self.max_output_tokens:,} cap"
        return None

    def input_price(self, cached_fraction: float = 0.0, writes: bool = False) -> float:
        """Dollars per prompt token of a token model when `cached_fraction` of the prompt is read from
        the cache and, with `writes`, the rest is written to it (at the write price where the provider
        charges one)."""
        assert self.kind == "token" and 0 <= cached_fraction <= 1
        written = 1.0 - cached_fraction if writes else 0.0
        return self._token_cost(Usage(1.0, 0.0, cached_fraction, written))

    def problem(self) -> str | None:
        """What is missing or wrong in this entry, or None."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in TEXT_FIELDS:
                if not isinstance(value, str):
                    return f"{f.name} must be a string"
            elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                return f"{f.name} must be a number"
            elif value is not None and not math.isfinite(value):
                return f"{f.name} must be a finite number"
            elif value is not None and value < 0:
                return f"{f.name} cannot be negative"
        if self.kind not in KINDS:
            return f"kind must be one of {', '.join(KINDS)}"
        if self.kind == "plan" and not self.requests_per_day:
            return "a plan needs requests_per_day > 0"
        return None


def load_pricing(path: Path | None = None) -> list[PricingModel]:
    """The [[model]] entries of a pricing file (default: the bundled one); ValueError naming the file
    and the entry for anything malformed."""
    path = path or DEFAULT_PRICING
    entries = read_toml(path, "pricing file").get("model", [])
    known = {f.name for f in dataclasses.fields(PricingModel)}
    models = []
    for entry in entries:
        name = entry.get("name", "?") if isinstance(entry, dict) else "?"
        unknown = sorted(set(entry) - known) if isinstance(entry, dict) else []
        if unknown:
            raise ValueError(f"{path}: {name}: unknown field(s) {', '.join(unknown)}")
        try:
            model = PricingModel(**entry)
        except TypeError as exc:
            raise ValueError(f"{path}: bad entry {name}: {exc}") from None
        problem = model.problem()
        if problem:
            raise ValueError(f"{path}: {model.name}: {problem}")
        models.append(model)
    if not models:
        raise ValueError(f"{path} holds no [[model]] entries")
    return models
