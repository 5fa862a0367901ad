"""How numbers read in every table llmopt prints or writes: the console's (cli/render.py) and the
report's (report/html.py) use these, so a figure looks the same in both.

The per-point table is defined once here (POINT_COLUMNS): the console's bench results table and the
report's "Summary per load point" are the same columns, the console showing a few more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmopt.bench.schema import PointSummary


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def money(value) -> str:
    if value is None:
        return "-"
    if value == 0:  # a free plan
        return "$0"
    if 0 < value < 1e-5:  # a cheap model's single request: six decimals would read $0.000000
        return f"${value:.2e}"
    return f"${value:,.6f}" if value < 0.01 else f"${value:,.4f}"


@dataclass(frozen=True)
class PointColumn:
    """One column of the per-point table: where its value sits in a point summary and how it reads."""

    header: str  # "{p}" stands for the tail percentile shown, e.g. "TTFT {p}" -> "TTFT p99"
    key: str  # the point summary's field (bench/schema.py's PointSummary)
    # for a latency field ({"median": .., "p99": ..}) which statistic, may be "{p}"; for a block its field
    stat: str | None = None
    digits: int | None = None  # None: the value as it is (names, counts); else fmt(value, digits)
    left: bool = False  # text columns read left-aligned in the console
    report_header: str | None = None  # the report's shorter header, where it differs
    console_only: bool = False  # shown by `llmopt bench`, left out of the HTML report
    unit: str | None = None  # the report's header names it, e.g. "TTFT p99 (ms)"
    flag: bool = False  # a true/false field, read "yes" or "no"

    def title(self, percentile: str, report: bool = False) -> str:
        header = self.report_header if report and self.report_header else self.header
        if report and self.unit:
            header = f"{header} ({self.unit})"
        return header.format(p=percentile)

    def cell(self, point: PointSummary, percentile: str) -> str:
        stat = self.stat.format(p=percentile) if self.stat is not None else None
        value = point.figure(self.key, stat)
        if self.flag:
            return "-" if value is None else "yes" if value else "no"
        if self.digits is None:
            return "-" if value is None else str(value)
        return fmt(value, self.digits)


POINT_COLUMNS = [
    PointColumn("server", "server", left=True),
    PointColumn("prompt", "prompt_len", report_header="in", unit="tokens"),
    PointColumn("output", "output_len", report_header="out", unit="tokens"),
    PointColumn("load", "load", left=True),
    PointColumn("ok", "successful", unit="requests"),
    PointColumn("failed", "failed", unit="requests"),
    PointColumn("reconn", "reconnects", report_header="reconnects", unit="requests"),
    # Answers to a response_format (JSON schema) cut by max_tokens, and ones not of the schema: not valid
    PointColumn("JSON cut", "structured_truncated", report_header="JSON truncated", unit="requests"),
    PointColumn("JSON bad", "structured_invalid", report_header="JSON invalid", unit="requests"),
    PointColumn("req/s", "request_throughput", digits=2),
    PointColumn("out tok/s", "output_throughput", digits=1),
    PointColumn("total tok/s", "total_token_throughput", digits=1, console_only=True),
    PointColumn("TTFT med", "ttft_ms", "median", digits=0, unit="ms"),
    PointColumn("TTFT {p}", "ttft_ms", "{p}", digits=0, unit="ms"),
    PointColumn("TPOT med", "tpot_ms", "median", digits=1, unit="ms"),
    PointColumn("ITL med", "itl_ms", "median", digits=1, unit="ms"),
    PointColumn("ITL {p}", "itl_ms", "{p}", digits=1, unit="ms"),
    # Tokens per streamed chunk: with speculative decoding, the client's estimate of tokens per decode step
    PointColumn("tok/chunk", "tokens_per_chunk", digits=2, report_header="tokens per chunk"),
    PointColumn("E2E med", "e2e_ms", "median", digits=0, unit="ms"),
    PointColumn("goodput", "goodput", digits=2, unit="req/s"),
    # The requests whose latencies count (bench/measure/steady_state.py), and whether the point saturated
    PointColumn("steady", "steady_state", "kept", report_header="steady state", unit="requests"),
    PointColumn("sat", "saturated", flag=True, report_header="saturated"),
    # The serving machine's cost of a token (bench/measure/token_cost.py): "-" where it could not be read
    PointColumn(
        "CPU s/1k tok", "cpu_s_per_1k_tokens", digits=2, report_header="server CPU", unit="s per 1k out"
    ),
    PointColumn("cores", "server_cores", digits=2, report_header="server cores", unit="CPU s / s"),
    PointColumn("J/tok", "joules_per_token", digits=3, report_header="energy", unit="J per out token"),
    # A decode step's weight bytes over the ITL, and that over this machine's read bandwidth (token_cost.py)
    PointColumn("reads GB/s", "decode_read_gbs", digits=1, report_header="decode reads", unit="GB/s"),
    PointColumn("of bw", "decode_read_share", digits=2, report_header="of machine bandwidth", unit="share"),
]


def point_columns(report: bool = False) -> list[PointColumn]:
    """The columns the console shows, or (report=True) the HTML report's."""
    return [c for c in POINT_COLUMNS if not (report and c.console_only)]
