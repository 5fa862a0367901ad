"""One self-contained HTML report for one or more bench runs: settings, tables, plots (inlined SVG
images) and cost. No script or stylesheet is fetched from anywhere; it opens offline in any browser."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

from jinja2 import Environment

from llmopt.bench.metrics import parse_slo
from llmopt.bench.redact import redact_args
from llmopt.pricing import PricingModel, cost_table, load_pricing
from llmopt.report import plots
from llmopt.report.data import Run, load_run
from llmopt.report.format import break_even, fmt, money, point_columns

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
    # Redacted here too: a run folder written before the bench redacted them may hold a server's key.
    servers = {p["server"]: redact_args(p.get("server_args")) for p in run.points}
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


# The report's tail percentile is p99 whatever the run asked for (the console shows the run's highest).
REPORT_PERCENTILE = "p99"
POINT_HEADERS = [c.title(REPORT_PERCENTILE, report=True) for c in point_columns(report=True)]


def point_rows(run: Run) -> list[list[str]]:
    columns = point_columns(report=True)
    return [[c.cell(p, REPORT_PERCENTILE) for c in columns] for p in run.points]


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


def slo_lines(runs: list[Run]) -> dict[str, float]:
    """Every run's SLOs in milliseconds (a later run's value for the same metric wins)."""
    slo: dict[str, float] = {}
    for run in runs:
        slo.update({k: v * 1000 for k, v in parse_slo(run.settings.get("config", {}).get("slo")).items()})
    return slo


def figures(runs: list[Run]) -> list[tuple[str, str]]:
    """(title, SVG) for each plot; the prefix-caching and speculation plots only when a run has them."""
    out = [
        ("Throughput against load", plots.throughput(runs)),
        ("Latency percentiles against load (p50 solid, p90 dashed, p99 dotted)", plots.latency(runs)),
        (
            "Latency against throughput, with the Pareto front and SLO lines",
            plots.latency_throughput(runs, slo_lines(runs)),
        ),
        ("CDFs of TTFT and end-to-end latency", plots.cdfs(runs)),
    ]
    prefix = plots.prefix_caching(runs)
    if prefix:
        out.append(("Prefix caching on and off", prefix))
    spec = plots.speculative(runs)
    if spec:
        out.append(("Speculative decoding: speed-up and acceptance against k", spec))
    return out


def cost_block(run: Run, models: list[PricingModel]) -> dict | None:
    """The run's measured request shape priced under every model, self-hosted at its best point's
    throughput; None when no request succeeded."""
    ok = [p for p in run.points if p["successful"]]
    if not ok:
        return None
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
    return {"title": title, "rows": rows, "svg": b64(svg)}


def render(runs: list[Run], pricing: Path | None) -> str:
    """The report's HTML for `runs`, priced with the models in `pricing` (default: the bundled file)."""
    models = load_pricing(pricing)
    blocks = [cost_block(run, models) for run in runs]
    env = Environment(autoescape=True)
    return env.from_string(TEMPLATE.read_text()).render(
        title=", ".join(r.name for r in runs),
        written=dt.datetime.now().isoformat(timespec="seconds"),
        runs=runs,
        run_settings=run_settings,
        point_headers=POINT_HEADERS,
        point_rows=point_rows,
        deltas=deltas(runs) if len(runs) > 1 else [],
        delta_metrics=DELTA_METRICS,
        figures=[(t, b64(svg)) for t, svg in figures(runs)],
        cost_blocks=[b for b in blocks if b is not None],
        pricing_source=str(pricing or "llmopt/pricing.toml"),
        money=money,
        break_even=break_even,
    )


def write_report(run_dirs: list[Path], out: Path, pricing: Path | None = None) -> Path:
    """Write the report for the bench runs in `run_dirs` to `out` (replaced whole, never half-written)."""
    runs = [load_run(Path(d)) for d in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    html = render(runs, pricing)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(html)
    tmp.rename(out)
    return out
