"""A workload priced under each pricing model: in all, per request and per conversation, with the
requests a pricing cannot serve (a plan's token caps); and the answer people want: which pricing is the
cheapest, and by how much."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmopt.pricing import PricingModel, TokenSums, Usage


@dataclass
class Workload:
    """Conversations of requests, each request's tokens as billed (a lone request: a one-turn
    conversation). `request_throughput` (requests/s that self-hosted serving sustains) prices gpu-hour
    models; `requests_per_minute` is the load a plan's rate cap must take, where known."""

    conversations: list[list[Usage]]
    request_throughput: float | None = None
    requests_per_minute: float | None = None

    @property
    def requests(self) -> int:
        return sum(len(c) for c in self.conversations)

    @property
    def multi_turn(self) -> bool:
        return any(len(c) > 1 for c in self.conversations)

    def token_totals(self) -> Usage:
        """Every request's tokens added up."""
        sums = TokenSums.of(u for c in self.conversations for u in c)
        return Usage(sums.prompt_tokens, sums.output_tokens, sums.cached_tokens, sums.cache_write_tokens)


@dataclass
class PricedWorkload:
    """One pricing model's bill for a workload. `total` covers the requests it can serve (None: it
    cannot be priced, e.g. a GPU hour without a throughput); `conversation_total` the conversations it
    serves whole."""

    model: PricingModel
    total: float | None = 0.0
    requests: int = 0
    refused: int = 0
    refusal: str | None = None
    conversations: int = 0
    conversation_total: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def serves_all(self) -> bool:
        return self.total is not None and self.refused == 0

    @property
    def per_request(self) -> float | None:
        return self.total / self.requests if self.total is not None and self.requests else None

    @property
    def per_conversation(self) -> float | None:
        if self.total is None or not self.conversations:
            return None
        return self.conversation_total / self.conversations


def price_workload(model: PricingModel, workload: Workload, utilisation: float = 1.0) -> PricedWorkload:
    """Every request of `workload` priced under `model`; a plan at `utilisation` of its daily quota."""
    priced = PricedWorkload(model)
    for conversation in workload.conversations:
        whole, dollars = True, 0.0
        for usage in conversation:
            why = model.refusal(usage)
            if why is not None:
                priced.refused += 1
                priced.refusal = priced.refusal or why
                whole = False
                continue
            cost = model.request_cost(usage, utilisation, workload.request_throughput)
            if cost is None:
                return PricedWorkload(model, None, notes=["no measured throughput to price GPU hours"])
            priced.total += cost
            priced.requests += 1
            dollars += cost
        if whole:
            priced.conversations += 1
            priced.conversation_total += dollars
    rate = workload.requests_per_minute
    if model.requests_per_minute is not None and rate is not None and rate > model.requests_per_minute:
        priced.notes.append(f"{rate:,.0f} requests/min is over its {model.requests_per_minute:,}/min cap")
    return priced


def rank(models: list[PricingModel], workload: Workload, utilisation: float = 1.0) -> list[PricedWorkload]:
    """Every model's bill, cheapest first: those that serve every request by cost, then those that
    refuse some, then those that cannot be priced."""

    def order(p: PricedWorkload) -> tuple:
        per_request = p.per_request if p.per_request is not None else float("inf")
        return (not p.serves_all, p.total is None, per_request)

    return sorted((price_workload(m, workload, utilisation) for m in models), key=order)


@dataclass
class Cheapest:
    """The cheapest pricing that serves every request and costs something, the next one, and the free
    plans that would serve it too (within their quota)."""

    best: PricedWorkload
    runner_up: PricedWorkload | None
    free: list[PricedWorkload]

    @property
    def factor(self) -> float | None:
        """How many times the runner-up's bill is the cheapest's."""
        if self.runner_up is None or not self.best.total:
            return None
        return self.runner_up.total / self.best.total


def cheapest(ranked: list[PricedWorkload]) -> Cheapest | None:
    """From `rank`'s list; None when no paid pricing serves every request."""
    whole = [p for p in ranked if p.serves_all]
    paid = [p for p in whole if p.total > 0]
    if not paid:
        return None
    return Cheapest(paid[0], paid[1] if len(paid) > 1 else None, [p for p in whole if p.total == 0])


def cheapest_per_open_model(ranked: list[PricedWorkload]) -> dict[str, Cheapest]:
    """For each open model that several providers price: its cheapest provider and the next."""
    groups: dict[str, list[PricedWorkload]] = {}
    for p in ranked:
        if p.model.open_model:
            groups.setdefault(p.model.open_model, []).append(p)
    out = {}
    for name, group in groups.items():
        answer = cheapest(group) if len(group) > 1 else None
        if answer is not None and answer.runner_up is not None:
            out[name] = answer
    return out
