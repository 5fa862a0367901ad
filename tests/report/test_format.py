"""The per-point table's columns as both the console and the report read them."""

from __future__ import annotations

import io

from rich.console import Console

from llmopt.bench.schema import PointSummary
from llmopt.cli.render import results_table
from llmopt.report.format import POINT_COLUMNS, PointColumn


def test_a_flag_column_reads_yes_no_or_a_dash():
    column = PointColumn("sat", "saturated", flag=True)
    points = [PointSummary.from_json(p) for p in ({"saturated": True}, {"saturated": False}, {})]
    assert [column.cell(p, "p99") for p in points] == [
        "yes",
        "no",
        "-",
    ]


def test_the_table_says_which_points_saturated_and_how_many_requests_their_latencies_count():
    by_header = {c.header: c for c in POINT_COLUMNS}
    point = {"saturated": True, "steady_state": {"kept": 32, "of": 40}}
    summary = PointSummary.from_json(point)
    assert by_header["sat"].cell(summary, "p99") == "yes" and by_header["steady"].cell(summary, "p99") == "32"
    assert by_header["steady"].title("p99", report=True) == "steady state (requests)"
    table = results_table([PointSummary.from_json({**point, "server": "s", "load": "rate=4/s"})])
    headers = [c.header for c in table.columns]
    assert "sat" in headers and list(table.columns[headers.index("sat")].cells) == ["yes"]


def test_a_file_or_pipe_gets_the_whole_table_however_many_columns():
    from llmopt.cli.render import natural_width

    point = {"server": "endpoint", "load": "concurrency=4", "saturated": False, "steady_state": {"kept": 6}}
    table = results_table(
        [PointSummary.from_json({**point, "ttft_ms": {}, "itl_ms": {}, "tpot_ms": {}, "e2e_ms": {}})]
    )
    out = Console(width=natural_width(table), file=io.StringIO())
    out.print(table)
    text = out.file.getvalue()
    assert natural_width(table) >= 200 and "concurrency=4" in text and "endpoint" in text
