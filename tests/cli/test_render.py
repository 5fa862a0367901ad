"""The CLI's tables, rendered as text: headers, cells, and the report's point table built from the same
column list. No model, no server: a point summary as bench/measure/request_metrics.py writes it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llmopt.bench.schema import PointSummary, RunSettings
from llmopt.cli.render import break_even_table, kl_table, quant_table, results_table, shape_bill_table
from llmopt.cost.break_even import break_evens
from llmopt.cost.conversation_shape import ConversationShape
from llmopt.cost.workload import Workload, rank
from llmopt.evaluate.kl_divergence import KLStats
from llmopt.pricing import PricingModel
from llmopt.quant.quant_report import QuantReport
from llmopt.report.html import POINT_HEADERS, point_rows
from llmopt.report.runs import Run


def latency(median: float, p90: float, p99: float) -> dict:
    return {"mean": median, "median": median, "p90": p90, "p99": p99}


POINT = {
    "key": "llmopt c=4 in128 out32",
    "server": "llmopt",
    "prompt_len": 128,
    "output_len": 32,
    "load": "c=4",
    "concurrency": 4,
    "request_rate": None,
    "successful": 40,
    "failed": 2,
    "reconnects": 1,
    "request_throughput": 3.14159,
    "output_throughput": 1234.56,
    "total_token_throughput": 5678.91,
    "ttft_ms": latency(101.4, 150.6, 199.5),
    "tpot_ms": latency(12.34, 15.0, 17.89),
    "itl_ms": latency(11.11, 20.0, 33.33),
    "e2e_ms": latency(880.2, 950.0, 1001.7),
    "goodput": 2.5,
}


def text(table: Table) -> str:
    console = Console(width=300, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def cells(table: Table) -> list[list[str]]:
    """The table's cells, row by row, as the strings handed to rich."""
    return [list(row) for row in zip(*(col._cells for col in table.columns))]


def by_header(table: Table) -> dict[str, str]:
    """The one row of a table, by column header."""
    [row] = cells(table)
    return dict(zip((c.header for c in table.columns), row))


def test_results_table_headers_and_cells():
    table = results_table([PointSummary.from_json(POINT)], "p90")
    headers = [c.header for c in table.columns]
    assert headers[:7] == ["server", "prompt", "output", "load", "ok", "failed", "reconn"]
    assert headers[9:20] == [
        "req/s", "out tok/s", "total tok/s", "TTFT med", "TTFT p90", "TPOT med", "ITL med", "ITL p90",
        "tok/chunk", "E2E med", "goodput",
    ]  # fmt: skip
    row = by_header(table)
    assert [row[h] for h in headers[:20]] == [
        "llmopt", "128", "32", "c=4", "40", "2", "1", "-", "-", "3.14", "1,234.6", "5,678.9",
        "101", "151", "12.3", "11.1", "20.0", "-", "880", "2.50",
    ]  # fmt: skip
    assert (row["JSON cut"], row["JSON bad"]) == ("-", "-")  # no structured requests in this point
    assert [c.justify for c in table.columns][:5] == ["left", "right", "right", "left", "right"]
    assert "1,234.6" in text(table)


def test_results_table_counts_structured_answers():
    point = {**POINT, "structured_valid": 5, "structured_truncated": 2, "structured_invalid": 1}
    row = by_header(results_table([PointSummary.from_json(point)]))
    assert (row["JSON cut"], row["JSON bad"]) == ("2", "1")


def test_results_table_without_goodput_or_latencies_shows_dashes():
    point = {**POINT, "ttft_ms": latency(None, None, None), "itl_ms": {"median": None}}
    del point["goodput"]
    row = by_header(results_table([PointSummary.from_json(point)]))
    assert [row[h] for h in ("TTFT med", "TTFT p99", "ITL med", "goodput")] == ["-"] * 4


def test_report_point_table_is_the_console_table_less_its_extra_columns():
    assert POINT_HEADERS[:11] == [
        "server", "in (tokens)", "out (tokens)", "load", "ok (requests)", "failed (requests)",
        "reconnects (requests)", "JSON truncated (requests)", "JSON invalid (requests)", "req/s", "out tok/s",
    ]  # fmt: skip
    assert POINT_HEADERS[11:19] == [
        "TTFT med (ms)", "TTFT p99 (ms)", "TPOT med (ms)", "ITL med (ms)", "ITL p99 (ms)", "tokens per chunk",
        "E2E med (ms)", "goodput (req/s)",
    ]  # fmt: skip
    run = Run("r", None, RunSettings(), [PointSummary.from_json(POINT)], [])
    [row] = point_rows(run)
    console = results_table([PointSummary.from_json(POINT)], "p99")
    [console_row] = cells(console)
    total = [c.header for c in console.columns].index("total tok/s")  # console only
    assert row == console_row[:total] + console_row[total + 1 :]
    report = dict(zip(POINT_HEADERS, row))
    assert report["TTFT p99 (ms)"] == "200" and report["ITL p99 (ms)"] == "33.3"


def test_cost_tables():
    models = [
        PricingModel("tok", "token", input_per_1m=3.0, output_per_1m=15.0),
        PricingModel("flat", "request", per_request=0.04),
        PricingModel("plan", "plan", per_month=30, requests_per_day=100, max_input_tokens=10_000),
        PricingModel("gpu", "gpu-hour", per_hour=2.0),
    ]
    shape = ConversationShape(8000, 500)
    table = shape_bill_table(rank(models, Workload([shape.usages()])), shape, 1000)
    assert table.title == "8,000 prompt + 500 output tokens per request"
    assert [c.header for c in table.columns] == [
        "pricing model", "kind", "$ / request", "$ / 1M output tokens", "$ for 1,000 requests", "note"
    ]  # fmt: skip
    rows = {row[0]: row for row in cells(table)}
    # 8000 * 3 / 1e6 + 500 * 15 / 1e6 = 0.0315; the plan: $30 / 3,000 requests
    assert rows["tok"] == ["tok", "token", "$0.0315", "$63.0000", "$31.5000", ""]
    assert rows["plan"][2:5] == ["$0.0100", "$20.0000", "$10.0000"]
    assert rows["flat"][2:5] == ["$0.0400", "$80.0000", "$40.0000"]
    assert rows["gpu"][2:] == ["-", "-", "-", "give --request-throughput"]
    assert [row[0] for row in cells(table)] == ["plan", "tok", "flat", "gpu"]  # cheapest first

    long = ConversationShape(8000, 500, turns=2)  # turn 2 sends 16,500 tokens: over the plan's cap
    table = shape_bill_table(rank(models, Workload([long.usages()])), long, 10)
    assert "$ / conversation" in [c.header for c in table.columns]
    plan = {row[0]: row for row in cells(table)}["plan"]
    assert plan[2:6] == ["-", "-", "-", "-"]
    assert plan[6] == "not servable: 16,500 prompt tokens > the 10,000 cap (1 of 2 turns fit)"

    matrix = break_even_table(break_evens(models, shape), shape)
    assert [c.header for c in matrix.columns] == [
        "token price",
        "flat ($0.0400 / request)",
        "plan ($0.0100 / request)",
    ]
    # against flat: 0.04 = P * 3e-6 + 0.0075 -> P = 10,833; turns: 2 * (0.04 - 0.006) / 0.0255 - 1 = 1.67
    # against the plan: 0.01 = P * 3e-6 + 0.0075 -> P = 833; at 8,000 tokens it wins from the first turn
    plan = "> 833 tok; from 1 turn; its caps stop at 1 turn"  # turn 2 sends 16,500 > 10,000
    assert cells(matrix) == [["tok", "> 10,833 tok; from 2 turns", plan]]


def test_quant_table():
    report = QuantReport(
        method="gptq",
        bits=4,
        group_size=64,
        calibration_samples=16,
        seq_len=128,
        seconds=61.4,
        size_before_mb=538.1,
        size_after_mb=120.04,
        perplexity_before=10.0,
        perplexity_after=10.5,
        decode_tok_s_before=40.0,
        decode_tok_s_after=50.0,
        source="src",
        out="out",
    )
    table = quant_table(report)
    assert (table.title, table.caption) == ("GPTQ 4-bit, group 64", "16 calibration samples, 61 s")
    assert [c.header for c in table.columns] == ["", "before", "after"]
    assert cells(table) == [
        ["size (MB)", "538.1", "120.0"],
        ["perplexity", "10.000", "10.500"],
        ["  change", "", "+5.0 %"],
        ["decode tok/s (batch 1)", "40.0", "50.0"],
        ["  speed-up", "", "1.25x"],
    ]
    report.group_size = None
    assert quant_table(report).title == "GPTQ 4-bit, per channel"


KLD = KLStats(
    mean=0.0123456,
    median=0.004,
    p99=0.1,
    p999=0.5,
    max=1.25,
    top1_agreement=0.9512,
    delta_p_mean=-0.00123,
    tokens=254,
)
KLD_CELLS = ["0.012346", "0.004000", "0.100000", "0.500000", "1.250000", "95.12 %", "-0.123 %"]


def test_kl_table():
    table = kl_table(KLD, "smollm2-135m", 14.56789)
    assert (table.title, table.caption) == ("KL divergence from smollm2-135m (float32)", "254 tokens")
    labels = ["mean KLD", "median KLD", "99.0% KLD", "99.9% KLD", "max KLD", "top-1 agreement"]
    assert cells(table) == [
        *map(list, zip([*labels, "mean Δp (next token)"], KLD_CELLS)),
        ["reference perplexity", "14.5679"],
    ]


def test_quant_table_with_the_kl_divergence_from_the_source():
    report = QuantReport("int8", 8, None, 8, 256, 9.0, 538.1, 160.0, 10.0, 10.1, 40.0, 60.0, "src", "out")
    report.kl_divergence_before = KLStats(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 254)
    report.kl_divergence_after = KLD
    rows = cells(quant_table(report))
    start = rows.index(["next-token distribution vs the source in fp32", "", ""])
    assert rows[start + 1] == ["  mean KLD", "0.000000", "0.012346"]
    assert [r[2] for r in rows[start + 1 :]] == KLD_CELLS
    assert rows[start + 6][1] == "100.00 %" and len(rows) == start + 8
