"""One self-contained HTML report for one or more bench runs: settings, tables, plots (inlined SVG
images) and cost. No script or stylesheet is fetched from anywhere; it opens offline in any browser."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

from jinja2 import Environment

from llmopt.bench.metrics import parse_slo
from llmopt.pricing import PricingModel, cost_table, load_pricing
from llmopt.report import plots
from llmopt.report.data import Run, load_run
from llmopt.report.format import break_even, fmt, money

DELTA_METRICS = [
    ("output_throughput", "out tok/s", None),
    ("request_throughput", "req/s", None),
    ("ttft_ms", "TTFT med", "median"),
    ("tpot_ms", "TPOT med", "median"),
    ("itl_ms", "ITL med", "median"),
    ("e2e_ms", "E2E med", "median"),
]

TEMPLATE = Path(__file__).with_name("template.html.j2")


def run_settings(run: Run) -> list[tuple[str, str]]:
    s = run.settings
    config = s.get("config", {})
    endpoints = sorted({p.get("endpoint", "") for p in run.points})
    models = sorted({p.get("model", "") for p in run.points})
    servers = {p["server"]: p.get("server_args") for p in run.points}
    machine = s.get("machine", {})
    return [
        ("endpoint(s)", ", ".join(endpoints)),
        ("model(s)", ", ".join(models)),
        ("server configs", "; ".join(f"{k}: {v}" if v else k for k, v in servers.items())),
        ("recipe", config.get("recipe") or "-"),
        ("workload", f"{config.get('workload')} (api {config.get('api')})"),
        ("started", s.get("started", "-")),
        (
            "machine",
            f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, {machine.get('system', '')}",
        ),
        (
            "token counts from",
            ", ".join(sorted({t for p in run.points for t in p.get("tokens_from", [])})) or "-",
        ),
    ]


POINT_HEADERS = [
    "server",
    "in",
    "out",
    "load",
    "ok",
    "failed",
    "req/s",
    "out tok/s",
    "TTFT med",
    "TTFT p99",
    "TPOT med",
    "ITL med",
    "ITL p99",
    "E2E med",
    "goodput",
]


def point_rows(run: Run) -> list[list[str]]:
    rows = []
    for p in run.points:
        rows.append(
            [
                p["server"],
                p["prompt_len"],
                p["output_len"],
                p["load"],
                p["successful"],
                p["failed"],
                fmt(p["request_throughput"], 2),
                fmt(p["output_throughput"]),
                fmt(p["ttft_ms"]["median"], 0),
                fmt(p["ttft_ms"].get("p99"), 0),
                fmt(p["tpot_ms"]["median"]),
                fmt(p["itl_ms"]["median"]),
                fmt(p["itl_ms"].get("p99")),
                fmt(p["e2e_ms"]["median"], 0),
                fmt(p.get("goodput"), 2),
            ]
        )
    return rows


def deltas(runs: list[Run]) -> list[dict]:
    """Each later run's points against the first run's point with the same workload and load."""
    base = {(p["prompt_len"], p["output_len"], p["load"]): p for p in runs[0].points}
    out = []
    for run in runs[1:]:
        for p in run.points:
            ref = base.get((p["prompt_len"], p["output_len"], p["load"]))
            if ref is None:
                continue
            cells = []
            for metric, _, stat in DELTA_METRICS:
                new, old = (p[metric][stat], ref[metric][stat]) if stat else (p[metric], ref[metric])
                if new is None or not old:
                    cells.append({"text": "-", "cls": ""})
                    continue
                change = (new - old) / old * 100
                higher_is_better = stat is None
                good = change > 0 if higher_is_better else change < 0
                cells.append({"text": f"{fmt(new)} ({change:+.1f}%)", "cls": "better" if good else "worse"})
            out.append(
                {
                    "run": run.name,
                    "point": f"{p['server']} in {p['prompt_len']} out {p['output_len']} {p['load']}",
                    "cells": cells,
                }
            )
    return out


def b64(svg: str) -> str:
    return base64.b64encode(svg.encode()).decode()


def write_report(run_dirs: list[Path], out: Path, pricing: Path | None = None) -> Path:
    runs = [load_run(Path(d)) for d in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    models: list[PricingModel] = load_pricing(pricing)
    slo = {}
    for run in runs:
        slo.update({k: v * 1000 for k, v in parse_slo(run.settings.get("config", {}).get("slo")).items()})
    figures = [
        ("Throughput against load", plots.throughput(runs)),
        ("Latency percentiles against load (p50 solid, p90 dashed, p99 dotted)", plots.latency(runs)),
        (
            "Latency against throughput, with the Pareto front and SLO lines",
            plots.latency_throughput(runs, slo),
        ),
        ("CDFs of TTFT and end-to-end latency", plots.cdfs(runs)),
    ]
    prefix = plots.prefix_caching(runs)
    if prefix:
        figures.append(("Prefix caching on and off", prefix))
    spec = plots.speculative(runs)
    if spec:
        figures.append(("Speculative decoding: speed-up and acceptance against k", spec))
    cost_blocks = []
    for run in runs:
        ok = [p for p in run.points if p["successful"]]
        if not ok:
            continue
        requests = sum(p["successful"] for p in ok)
        mean_in = sum(p["prompt_tokens"] for p in ok) / requests
        mean_out = sum(p["output_tokens"] for p in ok) / requests
        best = max(ok, key=lambda p: p["request_throughput"])
        rows = cost_table(models, mean_in, mean_out, 1000, best["request_throughput"])
        svg = plots.cost_vs_prompt_length(
            models, mean_out, sorted({p["prompt_len"] for p in ok}), best["request_throughput"]
        )
        title = (
            f"{run.name}: {mean_in:,.0f} prompt + {mean_out:,.0f} output tokens per request; "
            f"self-hosted at {best['request_throughput']:.2f} req/s ({best['server']}, {best['load']})"
        )
        cost_blocks.append({"title": title, "rows": rows, "svg": b64(svg)})
    env = Environment(autoescape=True)
    html = env.from_string(TEMPLATE.read_text()).render(
        title=", ".join(r.name for r in runs),
        written=dt.datetime.now().isoformat(timespec="seconds"),
        runs=runs,
        run_settings=run_settings,
        point_headers=POINT_HEADERS,
        point_rows=point_rows,
        deltas=deltas(runs) if len(runs) > 1 else [],
        delta_metrics=DELTA_METRICS,
        figures=[(t, b64(svg)) for t, svg in figures],
        cost_blocks=cost_blocks,
        pricing_source=str(pricing or "llmopt/pricing.toml"),
        money=money,
        break_even=break_even,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(html)
    tmp.rename(out)
    return out
