"""How prices, bills and break-even points read, in the console (cli/render.py) and in the report
(report/html.py) alike: a pricing's terms in one line, the cheapest-pricing sentence, a break-even cell."""

from __future__ import annotations

from llmopt.cost.break_even import BreakEven
from llmopt.cost.conversation_shape import ConversationShape
from llmopt.cost.from_run import ServedWorkload
from llmopt.cost.workload import Cheapest, PricedWorkload, cheapest, cheapest_per_open_model
from llmopt.pricing import PricingModel
from llmopt.report.format import money


def price_terms(m: PricingModel) -> str:
    """A pricing model's prices as its kind states them."""
    if m.kind == "token":
        parts = [f"in ${m.input_per_1m:g}"]
        if m.cached_input_per_1m is not None:
            parts.append(f"cached in ${m.cached_input_per_1m:g}")
        if m.cache_write_per_1m is not None:
            parts.append(f"cache write ${m.cache_write_per_1m:g}")
        return ", ".join(parts + [f"out ${m.output_per_1m:g}"]) + " per 1M tokens"
    if m.kind == "request":
        return f"${m.per_request:g} per request"
    if m.kind == "gpu-hour":
        return f"${m.per_hour:g} per GPU-hour"
    terms = f"${m.per_month:g}/month for {m.requests_per_day:,} requests/day"
    if m.requests_per_minute is not None:
        terms += f", {m.requests_per_minute:,}/min"
    caps = [f"{c:,} {what}" for c, what in ((m.max_input_tokens, "in"), (m.max_output_tokens, "out")) if c]
    if caps:
        terms += f", at most {' / '.join(caps)} tokens per request"
    return terms


def bill_note(p: PricedWorkload, multi_turn: bool = False) -> str:
    """Why a bill is incomplete or what to watch: refused requests, a rate cap, a missing throughput."""
    notes = list(p.notes)
    if p.refused:
        unit = "turns" if multi_turn else "requests"
        fit = f"{p.requests:,} of {p.requests + p.refused:,} {unit} fit"
        notes.insert(0, f"not servable: {p.refusal} ({fit})")
    return "; ".join(notes)


def cheapest_sentence(answer: Cheapest | None, per_conversation: bool, scope: str = "") -> str:
    """'X is the cheapest ...: $a per request, 2.3x less than Y ($b)'; `scope` names a group (an open
    model) the comparison is limited to."""
    if answer is None:
        return f"{scope}no paid pricing serves every request"

    def each(p: PricedWorkload) -> str:
        value = p.per_conversation if per_conversation else p.per_request
        return f"{money(value)} per {'conversation' if per_conversation else 'request'}"

    text = f"{scope}{answer.best.model.name} is the cheapest that serves every request: {each(answer.best)}"
    if answer.runner_up is not None:
        text += f", {answer.factor:,.1f}x less than {answer.runner_up.model.name} ({each(answer.runner_up)})"
    if answer.free:
        names = ", ".join(p.model.name for p in answer.free)
        text += f"; {names} would cost nothing within its daily quota"
    return text


def turns_of(n: int) -> str:
    return f"{n:,} turn" + ("" if n == 1 else "s")


def break_even_cell(b: BreakEven) -> str:
    """Where the price per request starts to beat the token price: the new prompt tokens per turn at
    the asked turns, and the turn count (what caching moves it from, in brackets)."""
    if b.turns is None:
        return "never"
    if not b.reachable:
        return f"never within its caps ({turns_of(b.max_turns)})" if b.max_turns else "never: over its caps"
    if b.prompt_tokens is None:  # free input: prompt length never matters
        prompt = "any prompt" if b.turns == 1 else "-"
    else:
        prompt = "any prompt" if b.prompt_tokens == 0 else f"> {b.prompt_tokens:,.0f} tok"
    turns = f"from {turns_of(b.turns)}"
    if b.turns_uncached != b.turns and b.turns_uncached is not None:
        turns += f" ({b.turns_uncached:,} uncached)"
    caps = f"; its caps stop at {turns_of(b.max_turns)}" if b.max_turns is not None else ""
    return f"{prompt}; {turns}{caps}"


def bill_headers(multi_turn: bool, total_header: str) -> list[str]:
    """The bill table's columns (console and report): per request, per conversation where the
    workload has several turns, per 1M output tokens, in all, and what to watch."""
    headers = ["pricing model", "kind", "$ / request"]
    if multi_turn:
        headers.append("$ / conversation")
    return headers + ["$ / 1M output tokens", total_header, "note"]


def bill_cells(
    p: PricedWorkload, multi_turn: bool, output_tokens: float, scale: float, unpriced: str
) -> list:
    """One pricing's cells under bill_headers: its bill for a workload of `output_tokens` output tokens,
    the total times `scale`; dashes where it cannot serve every request, `unpriced` where it has no price."""
    whole = p.serves_all
    cells = [p.model.name, p.model.kind, money(p.per_request if whole else None)]
    if multi_turn:
        cells.append(money(p.per_conversation if whole else None))
    per_1m = p.total / output_tokens * 1e6 if whole and output_tokens else None
    cells += [money(per_1m), money(p.total * scale if whole else None)]
    return cells + [unpriced if p.total is None else bill_note(p, multi_turn)]


def break_even_matrix(rows: list[BreakEven]) -> tuple[list[str], list[list[str]]]:
    """Token prices (rows) against prices per request (columns, only the cheapest GPU hour): headers
    and cells."""
    gpu = [b for b in rows if b.flat.kind == "gpu-hour"]
    if gpu:
        cheapest_gpu = min(gpu, key=lambda b: b.per_request).flat.name
        rows = [b for b in rows if b.flat.kind != "gpu-hour" or b.flat.name == cheapest_gpu]
    flats = {b.flat.name: b.per_request for b in rows}
    cells: dict[str, dict[str, str]] = {}
    for b in rows:
        cells.setdefault(b.token.name, {})[b.flat.name] = break_even_cell(b)
    headers = ["token price"] + [f"{name} ({money(price)} / request)" for name, price in flats.items()]
    return headers, [[token] + [by.get(name, "-") for name in flats] for token, by in cells.items()]


def break_even_title(shape: ConversationShape) -> str:
    return (
        f"Break-even at {shape.prompt_tokens:,.0f} new prompt + {shape.output_tokens:,.0f} output tokens "
        f"per turn: the prompt length above which each price per request beats each token price at "
        f"{shape.turns} turn(s), and the turns from which it does"
        + (" (in brackets: without the cached share)" if shape.cached_fraction else "")
    )


def run_bill_title(served: ServedWorkload, run_name: str) -> str:
    """What a run's bill covers: its requests, their mean tokens, and how self-hosting was priced."""
    w = served.workload
    totals, n = w.token_totals(), w.requests
    cached = totals.cached_tokens / totals.prompt_tokens if totals.prompt_tokens else 0.0
    title = f"{run_name} / {served.server}: {n:,} requests"
    if w.multi_turn:
        title += f" in {len(w.conversations):,} conversations"
    title += (
        f", {totals.prompt_tokens / n:,.0f} prompt ({cached:.0%} cached) + "
        f"{totals.output_tokens / n:,.0f} output tokens per request; self-hosted "
    )
    if served.point is None:
        return title + f"not priced: {served.basis}"
    return title + f"at {w.request_throughput:.2f} req/s ({served.point.load}, {served.basis})"


def answer_lines(ranked: list[PricedWorkload], per_conversation: bool) -> list[str]:
    """The answer first, then the cheapest provider of each open model that several providers sell."""
    lines = [cheapest_sentence(cheapest(ranked), per_conversation)]
    by_model = cheapest_per_open_model(ranked).items()
    return lines + [cheapest_sentence(a, per_conversation, f"{name}: ") for name, a in by_model]
