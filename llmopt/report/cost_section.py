"""The report's cost section: each server config's requests of each run priced under every pricing
model, the cheapest and by how much, where prices per request break even with token prices at the run's
shape, and cost per conversation against turns."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from llmopt.cost.break_even import break_evens, conversation_cost, flat_price
from llmopt.cost.conversation_shape import ConversationShape
from llmopt.cost.from_run import ServedWorkload, mean_shape, served_workloads
from llmopt.cost.workload import Cheapest, cheapest, rank
from llmopt.pricing import PricingModel
from llmopt.report import plots
from llmopt.report.cost_format import (
    answer_lines,
    bill_cells,
    bill_headers,
    break_even_matrix,
    break_even_title,
    run_bill_title,
)
from llmopt.report.runs import Run

TOKEN_LINES = 8  # token prices drawn per plot: more lines than this no longer read


@dataclass
class CostBlock:
    """One server config of one run, priced: what the template shows, and the answer for the headline."""

    run: str
    server: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    answer: list[str]
    cheapest: Cheapest | None
    break_even_title: str = ""
    break_even_headers: list[str] = field(default_factory=list)
    break_even_rows: list[list[str]] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (title, base64 SVG)


def cost_blocks(run: Run, models: list[PricingModel], utilisation: float = 1.0) -> list[CostBlock]:
    """A block for each server config of `run` with at least one successful request."""
    served = served_workloads(run.records, run.points)
    return [cost_block(run, s, models, utilisation) for s in served if s.workload.requests]


def cost_block(run: Run, served: ServedWorkload, models: list[PricingModel], utilisation: float) -> CostBlock:
    w = served.workload
    ranked = rank(models, w, utilisation)
    output = w.token_totals().output_tokens
    block = CostBlock(
        run.name,
        served.server,
        run_bill_title(served, run.name),
        bill_headers(w.multi_turn, f"$ for the run's {w.requests:,} requests"),
        [bill_cells(p, w.multi_turn, output, 1.0, served.basis) for p in ranked],
        answer_lines(ranked, w.multi_turn),
        cheapest(ranked),
    )
    shape = mean_shape(w)
    rows = break_evens(models, shape, utilisation, w.request_throughput)
    if rows:
        block.break_even_title = break_even_title(shape)
        block.break_even_headers, block.break_even_rows = break_even_matrix(rows)
    block.figures = cost_figures(run, served, models, shape, utilisation)
    return block


def drawn(
    models: list[PricingModel], shape: ConversationShape, utilisation: float, throughput: float | None
) -> tuple[list[PricingModel], list[tuple[PricingModel, float]]]:
    """What the cost plots draw: the token prices (of each open model its cheapest provider, and each
    closed model; the cheapest few and the dearest) and every paid price per request with its price
    (of GPU hours only the cheapest)."""
    best: dict[str, PricingModel] = {}
    for m in (m for m in models if m.kind == "token"):
        group = m.open_model or m.name
        if group not in best or conversation_cost(m, shape) < conversation_cost(best[group], shape):
            best[group] = m
    tokens = sorted(best.values(), key=lambda m: conversation_cost(m, shape))
    if len(tokens) > TOKEN_LINES:
        tokens = tokens[: TOKEN_LINES - 1] + tokens[-1:]
    flats = [(m, flat_price(m, utilisation, throughput)) for m in models if m.kind != "token"]
    flats = [(m, price) for m, price in flats if price]  # a free plan or an unpriced GPU hour: no line
    gpu = [f for f in flats if f[0].kind == "gpu-hour"]
    flats = [f for f in flats if f[0].kind != "gpu-hour"] + ([min(gpu, key=lambda f: f[1])] if gpu else [])
    return tokens, flats


def cost_figures(
    run: Run, served: ServedWorkload, models: list[PricingModel], shape: ConversationShape, utilisation: float
) -> list[tuple[str, str]]:
    tokens, flats = drawn(models, shape, utilisation, served.workload.request_throughput)
    per_turn = f"{shape.prompt_tokens:,.0f} new prompt + {shape.output_tokens:,.0f} output tokens per turn"
    prompt_lens = sorted({p.prompt_len for p in run.points if p.server == served.server})
    svgs = [
        (
            f"{run.name} / {served.server}: cost per conversation against turns ({per_turn})",
            plots.cost_vs_turns(tokens, flats, shape),
        ),
        (
            f"{run.name} / {served.server}: cost per request against prompt length",
            plots.cost_vs_prompt_length(tokens, flats, shape.output_tokens, prompt_lens),
        ),
    ]
    return [(title, base64.b64encode(svg.encode()).decode()) for title, svg in svgs]
