"""Every rich table the CLI prints."""

from __future__ import annotations

from rich.table import Table

from llmopt.report.format import fmt


def results_table(points: list[dict], percentile: str = "p99") -> Table:
    table = Table(title="llmopt bench")
    columns = [
        "server",
        "prompt",
        "output",
        "load",
        "ok",
        "failed",
        "req/s",
        "out tok/s",
        "total tok/s",
        "TTFT med",
        f"TTFT {percentile}",
        "TPOT med",
        "ITL med",
        f"ITL {percentile}",
        "E2E med",
        "goodput",
    ]
    for col in columns:
        table.add_column(col, justify="right" if col not in ("server", "load") else "left")
    for p in points:
        table.add_row(
            p["server"],
            str(p["prompt_len"]),
            str(p["output_len"]),
            p["load"],
            str(p["successful"]),
            str(p["failed"]),
            fmt(p["request_throughput"], 2),
            fmt(p["output_throughput"]),
            fmt(p["total_token_throughput"]),
            fmt(p["ttft_ms"]["median"], 0),
            fmt(p["ttft_ms"].get(percentile), 0),
            fmt(p["tpot_ms"]["median"]),
            fmt(p["itl_ms"]["median"]),
            fmt(p["itl_ms"].get(percentile)),
            fmt(p["e2e_ms"]["median"], 0),
            fmt(p.get("goodput"), 2) if "goodput" in p else "-",
        )
    return table
