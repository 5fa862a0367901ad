"""Every rich table the CLI prints: bench results, cost comparison, quantization report. The commands
only parse, call their job and print what these return."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from llmopt.report.cost_format import (
    answer_lines,
    bill_cells,
    bill_headers,
    break_even_matrix,
    break_even_title,
    price_terms,
    run_bill_title,
)
from llmopt.report.format import fmt, point_columns

if TYPE_CHECKING:  # annotations only: the quant package, say, is imported only by `llmopt quantize`
    from llmopt.bench.schema import PointSummary
    from llmopt.cost.break_even import BreakEven
    from llmopt.cost.conversation_shape import ConversationShape
    from llmopt.cost.from_run import ServedWorkload
    from llmopt.cost.workload import PricedWorkload
    from llmopt.evaluate.kl_divergence import KLStats
    from llmopt.pricing import PricingModel
    from llmopt.quant.quant_report import QuantReport
    from llmopt.report.verdict import Check


def results_table(points: list[PointSummary], percentile: str = "p99") -> Table:
    """One row per load point (the report's point table, plus the console's extra columns)."""
    table = Table(title="llmopt bench")
    columns = point_columns()
    for col in columns:
        table.add_column(col.title(percentile), justify="left" if col.left else "right")
    for p in points:
        table.add_row(*(col.cell(p, percentile) for col in columns))
    return table


# Where most of a turn's prompt came from (bench/measure/session_metrics.py's prefix sources), as headed here.
PREFIX_COLUMNS = (
    ("ram", "TTFT, prefix in RAM"),
    ("disk", "TTFT, prefix from disk"),
    ("computed", "TTFT, recomputed"),
)


def turns_table(points: list[PointSummary]) -> Table | None:
    """Multi-turn points turn by turn: the prompt's cached share and its part from a disk tier, TTFT,
    and the median TTFT of the turns whose prompt came mostly from the prefix cache in RAM, from its disk
    tier, or was computed again (how many such turns in brackets); None without a multi-turn point."""
    rows = []
    for p in points:
        for t in p.turns or []:
            split = t.ttft_by_prefix or {}
            cells = [
                f"{s.ttft_ms['median']:,.0f} ms ({s.turns})" if (s := split.get(k)) else "-"
                for k, _ in PREFIX_COLUMNS
            ]
            cached, disk = t.cached_fraction, t.disk_cached_fraction
            rows.append(
                [
                    p.key or "-",
                    str(t.turn),
                    str(t.successful),
                    fmt(t.prompt_tokens_mean, 0),
                    "-" if cached is None else f"{cached:.0%}",
                    "-" if disk is None else f"{disk:.0%}",
                    f"{fmt(t.ttft_ms['median'], 0)} ms",
                    *cells,
                ]
            )
    if not rows:
        return None
    table = Table(title="turns: TTFT by where the prefix came from (median, turns in brackets)")
    for header in (
        "point",
        "turn",
        "ok",
        "prompt",
        "cached",
        "from disk",
        "TTFT med",
        *(h for _, h in PREFIX_COLUMNS),
    ):
        table.add_column(header, justify="left" if header == "point" else "right")
    for row in rows:
        table.add_row(*row)
    return table


def natural_width(table: Table) -> int:
    """The width `table` takes unsqueezed, at least 200: what a file or a pipe gets, so that no column
    of it wraps (however many columns the points have)."""
    return max(200, Console(width=100_000).measure(table).maximum)


def client_warning(summary: PointSummary) -> Text | None:
    """The warning for a point whose client, not the server, was the limit (bench/load/self_check.py); None
    for any other point."""
    client = summary.client
    if client is None or not client.limited:
        return None
    reasons = "; ".join(client.limited_by)
    return Text(
        f"{summary.key}: warning: client-limited: {reasons}. Its figures measure the client as much "
        f"as the server: give more --workers (now {client.workers}) or use a quieter machine",
        style="yellow",
    )


def pricing_table(models: list[PricingModel]) -> Table:
    """`llmopt cost --list`: every pricing model with its terms, source and date."""
    table = Table(title=f"{len(models)} pricing models (US dollars)")
    for col in ("pricing model", "kind", "open model", "prices", "date", "source", "note"):
        short = col in ("pricing model", "kind", "date")  # never broken: a name, a word, a date
        table.add_column(col, no_wrap=short, overflow="fold")
    for m in models:
        table.add_row(
            m.name, m.kind, m.open_model or "-", price_terms(m), m.date or "-", m.source or "-", m.note
        )
    return table


def table_of(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    """A table of text cells: names never wrapped, dollar columns right-aligned, long text folded."""
    table = Table(title=title)
    for i, header in enumerate(headers):
        if i == 0:
            table.add_column(header, no_wrap=True)
        else:
            table.add_column(header, justify="right" if header.startswith("$") else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def shape_bill_table(ranked: list[PricedWorkload], shape: ConversationShape, requests: int) -> Table:
    """The bill of `requests` conversations of `shape` (`ranked` priced one of them), cheapest first."""
    multi = shape.turns > 1
    p, o = f"{shape.prompt_tokens:,.0f}", f"{shape.output_tokens:,.0f}"
    if multi:
        title = f"{p} new prompt + {o} output tokens per turn, {shape.turns} turns (history replayed)"
    else:
        title = f"{p} prompt + {o} output tokens per request"
    if shape.cached_fraction:
        title += f", {shape.cached_fraction:.0%} of each prompt cached"
    headers = bill_headers(multi, f"$ for {requests:,} {'conversations' if multi else 'requests'}")
    output = shape.output_tokens * shape.turns
    rows = [bill_cells(x, multi, output, requests, "give --request-throughput") for x in ranked]
    return table_of(title, headers, rows)


def run_bill_table(ranked: list[PricedWorkload], served: ServedWorkload, run_name: str) -> Table:
    """The bill of one server config's requests in a run, cheapest first."""
    w = served.workload
    headers = bill_headers(w.multi_turn, f"$ for the run's {w.requests:,} requests")
    output = w.token_totals().output_tokens
    rows = [bill_cells(x, w.multi_turn, output, 1.0, served.basis) for x in ranked]
    return table_of(run_bill_title(served, run_name), headers, rows)


def answer(ranked: list[PricedWorkload], per_conversation: bool) -> list[Text]:
    """Which pricing is the cheapest and by how much, overall and for each open model several sell."""
    return [Text(line) for line in answer_lines(ranked, per_conversation)]  # Text: "[x]" is no markup


def break_even_table(rows: list[BreakEven], shape: ConversationShape) -> Table:
    """Token prices (rows) against prices per request (columns): where the latter become cheaper."""
    headers, cells = break_even_matrix(rows)
    return table_of(break_even_title(shape), headers, cells)


# What a KL comparison shows, in llama.cpp's order of interest: the divergence, then the tokens.
KL_LABELS = (
    "mean KLD",
    "median KLD",
    "99.0% KLD",
    "99.9% KLD",
    "max KLD",
    "top-1 agreement",
    "mean Δp (next token)",
)


def kl_cells(stats: KLStats | None) -> list[str]:
    """One cell per KL_LABELS: KLDs in nats, the shares in percent ("-" for each when not measured)."""
    if stats is None:
        return ["-"] * len(KL_LABELS)
    klds = (stats.mean, stats.median, stats.p99, stats.p999, stats.max)
    return [
        *(f"{x:.6f}" for x in klds),
        f"{stats.top1_agreement * 100:.2f} %",
        f"{stats.delta_p_mean * 100:+.3f} %",
    ]


def kl_table(stats: KLStats, reference: str, reference_perplexity: float) -> Table:
    """`llmopt eval --reference`: the KL divergence from the reference and the reference's perplexity."""
    title = f"KL divergence from {reference} (float32)"
    # As wide as its title: rich wraps a title to the table's width, and these two columns are narrow.
    table = Table(title=title, caption=f"{stats.tokens} tokens", min_width=len(title) + 4, show_header=False)
    table.add_column("", justify="left")
    table.add_column("", justify="right")
    for label, cell in zip(KL_LABELS, kl_cells(stats)):
        table.add_row(label, cell)
    table.add_row("reference perplexity", f"{reference_perplexity:.4f}")
    return table


def quant_rows(report: QuantReport) -> list[tuple[str, str, str]]:
    """(what, before, after) for the quantization table."""

    def change(before: float, after: float) -> str:
        return f"{(after / before - 1) * 100:+.1f} %"

    return [
        ("size (MB)", f"{report.size_before_mb:.1f}", f"{report.size_after_mb:.1f}"),
        ("perplexity", f"{report.perplexity_before:.3f}", f"{report.perplexity_after:.3f}"),
        ("  change", "", change(report.perplexity_before, report.perplexity_after)),
        (
            "decode tok/s (batch 1)",
            f"{report.decode_tok_s_before:.1f}",
            f"{report.decode_tok_s_after:.1f}",
        ),
        ("  speed-up", "", f"{report.decode_tok_s_after / report.decode_tok_s_before:.2f}x"),
        *kl_rows(report),
    ]


def kl_rows(report: QuantReport) -> list[tuple[str, str, str]]:
    """The KL divergence from the source in float32, before (the source as the engine runs it) and after;
    none for a report made with --no-kld."""
    if report.kl_divergence_after is None:
        return []
    before, after = kl_cells(report.kl_divergence_before), kl_cells(report.kl_divergence_after)
    heading = ("next-token distribution vs the source in fp32", "", "")
    return [heading, *((f"  {label}", b, a) for label, b, a in zip(KL_LABELS, before, after))]


def quant_table(report: QuantReport) -> Table:
    """Size, perplexity, decode speed and the KL divergence from the source, before and after, titled with
    the scheme."""
    group = "per channel" if report.group_size is None else f"group {report.group_size}"
    table = Table(
        title=f"{report.method.upper()} {report.bits}-bit, {group}",
        caption=f"{report.calibration_samples} calibration samples, {report.seconds:.0f} s",
    )
    for column in ("", "before", "after"):
        table.add_column(column, justify="left" if not column else "right")
    for row in quant_rows(report):
        table.add_row(*row)
    return table


def verdict_table(checks: list[Check]) -> Table:
    """`llmopt report --fail-if`: each condition at each matched point, what moved and whether it fails."""
    from llmopt.report.verdict import VERDICT_HEADERS, verdict_cells  # numpy: only when a verdict is asked

    failed = sum(c.holds for c in checks)
    rows = [verdict_cells(c) for c in checks]
    return table_of(f"--fail-if: {failed} of {len(checks)} check(s) fail", VERDICT_HEADERS, rows)
