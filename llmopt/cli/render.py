"""Every rich table the CLI prints: bench results, cost comparison, quantization report. The commands
only parse, call their job and print what these return."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from llmopt.report.format import break_even, money, point_columns

if TYPE_CHECKING:  # the quant package is imported only when `llmopt quantize` runs
    from llmopt.quant.report import QuantReport


def results_table(points: list[dict], percentile: str = "p99") -> Table:
    """One row per load point (the report's point table, plus the console's extra columns)."""
    table = Table(title="llmopt bench")
    columns = point_columns()
    for col in columns:
        table.add_column(col.title(percentile), justify="left" if col.left else "right")
    for p in points:
        table.add_row(*(col.cell(p, percentile) for col in columns))
    return table


COST_HEADERS = (
    "pricing model",
    "kind",
    "$ / request",
    "$ / 1M output tokens",
    "$ for {requests:,} requests",
    "break-even prompt length",
)
COST_LEFT = ("pricing model", "kind", "break-even prompt length")


def cost_table(rows: list[dict], prompt_tokens: float, output_tokens: float, requests: int) -> Table:
    """Rows of llmopt.pricing.cost_table for one request shape, priced for `requests` requests."""
    table = Table(title=f"{prompt_tokens:,.0f} prompt + {output_tokens:,.0f} output tokens per request")
    for col in COST_HEADERS:
        table.add_column(col.format(requests=requests), justify="left" if col in COST_LEFT else "right")
    for r in rows:
        total = money(r["total"]) if r["total"] is not None else "- (give --request-throughput)"
        table.add_row(
            r["name"],
            r["kind"],
            money(r["per_request"]),
            money(r["per_1m_output_tokens"]),
            total,
            break_even(r),
        )
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
    ]


def quant_table(report: QuantReport) -> Table:
    """Size, perplexity and decode speed before and after, titled with the scheme."""
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
