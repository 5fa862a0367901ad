"""One self-contained HTML report for one or more bench runs: settings, tables, plots (inlined SVG
images) and cost. No script or stylesheet is fetched from anywhere; it opens offline in any browser."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

from jinja2 import Environment

from llmopt.bench.rundir import recorded_server_args, recorded_slo
from llmopt.bench.schema import Machine
from llmopt.pricing import load_pricing
from llmopt.report import plots, server_metrics_section
from llmopt.report.client_habits import HEADERS as HABIT_HEADERS
from llmopt.report.client_habits import habit_tables
from llmopt.report.cost_section import cost_blocks
from llmopt.report.format import fmt, point_columns
from llmopt.report.headline import HEADERS as HEADLINE_HEADERS
from llmopt.report.headline import headlines
from llmopt.report.machine_cost import cost_source_lines
from llmopt.report.point_notes import point_notes
from llmopt.report.quantization import HEADERS as QUANTIZATION_HEADERS
from llmopt.report.quantization import quantization_sections
from llmopt.report.runs import Run, load_run
from llmopt.report.verdict import VERDICT_HEADERS, Check, verdict_cells

DELTA_METRICS = [
    ("output_throughput", "out tok/s", None),
    ("request_throughput", "req/s", None),
    ("ttft_ms", "TTFT med (ms)", "median"),
    ("tpot_ms", "TPOT med (ms)", "median"),
    ("itl_ms", "ITL med (ms)", "median"),
    ("e2e_ms", "E2E med (ms)", "median"),
]

TEMPLATE = Path(__file__).with_name("template.html.j2")


def run_settings(run: Run) -> list[tuple[str, str]]:
    s = run.settings
    endpoints = sorted({p.endpoint for p in run.points})
    models = sorted({p.model for p in run.points})
    # Redacted here too: a run folder written before the bench redacted them may hold a server's key.
    servers = {p.server: recorded_server_args(p) for p in run.points}
    return [
        ("endpoint(s)", ", ".join(endpoints)),
        ("model(s)", ", ".join(models)),
        ("server configs", "; ".join(f"{k}: {v}" if v else k for k, v in servers.items())),
        ("recipe", s.recipe or "-"),
        ("workload", f"{s.workload} (api {s.api})"),
        ("started", s.started or "-"),
        ("machine", machine_text(s.machine)),
        (
            "token counts from",
            ", ".join(sorted({t for p in run.points for t in p.tokens_from})) or "-",
        ),
        *search_answers(run),
    ]


def machine_text(machine: Machine | None) -> str:
    if machine is None:
        return "?, ? cores, "
    cpu, cores = machine.cpu or "?", "?" if machine.cores is None else machine.cores
    return f"{cpu}, {cores} cores, {machine.system or ''}"


def search_answers(run: Run) -> list[tuple[str, str]]:
    """A settings row per goodput search of the run: the answer point, or that none met the SLOs."""
    rows = []
    for s in run.settings.search or []:
        found = s.answer_key or "no probe met them"
        rows.append(
            (
                f"goodput search ({s.server}, in {s.prompt_len}, out {s.output_len})",
                f"highest load meeting {s.slo} at p{s.percentile:g}: {found} ({len(s.probes)} probes)",
            )
        )
    return rows


# The report's tail percentile is p99 whatever the run asked for (the console shows the run's highest).
REPORT_PERCENTILE = "p99"
POINT_HEADERS = [c.title(REPORT_PERCENTILE, report=True) for c in point_columns(report=True)]


def point_rows(run: Run) -> list[list[str]]:
    columns = point_columns(report=True)
    return [[c.cell(p, REPORT_PERCENTILE) for c in columns] for p in run.points]


SESSION_HEADERS = [
    *("server", "turn len", "load", "sessions", "completed", "failed", "turns/s"),
    *("conversation med (ms)", "conversation p99 (ms)", "tools"),
]


def session_rows(run: Run) -> list[list[str]]:
    """One row per multi-turn point: its sessions, turns per second, conversation latency, tools."""
    rows = []
    for p in run.points:
        if (c := p.conversations) is None:
            continue
        latency = c.conversation_ms
        counts = [str(c.started), str(c.completed), str(c.failed), fmt(c.turns_per_s, 2)]
        figures = [fmt(latency.get("median"), 0), fmt(latency.get("p99"), 0), p.tools or "-"]
        rows.append([p.server, str(p.prompt_len), p.load, *counts, *figures])
    return rows


def deltas(runs: list[Run]) -> list[dict]:
    """Each later run's points against the first run's point with the same workload and load."""
    base = {(p.prompt_len, p.output_len, p.load): p for p in runs[0].points}
    out = []
    for run in runs[1:]:
        for p in run.points:
            ref = base.get((p.prompt_len, p.output_len, p.load))
            if ref is None:
                continue
            cells = []
            for metric, _, stat in DELTA_METRICS:
                new, old = p.figure(metric, stat), ref.figure(metric, stat)
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
                    "point": f"{p.server} in {p.prompt_len} out {p.output_len} {p.load}",
                    "cells": cells,
                }
            )
    return out


def b64(svg: str) -> str:
    return base64.b64encode(svg.encode()).decode()


def optional_b64(svg: str | None) -> str | None:
    return None if svg is None else b64(svg)


def slo_lines(runs: list[Run]) -> dict[str, float]:
    """Every run's SLOs in milliseconds (a later run's value for the same metric wins)."""
    slo: dict[str, float] = {}
    for run in runs:
        slo.update({k: v * 1000 for k, v in recorded_slo(run.settings).items()})
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
    timeline = plots.timeline(runs)
    if timeline:
        out.append(("Per-request timeline of the busiest points (sent, first token, last byte)", timeline))
    by_turn = plots.turns(runs)
    if by_turn:
        out.append(("Multi-turn sessions by turn: TTFT, E2E and prefix-cached share of the prompt", by_turn))
    prefix = plots.prefix_caching(runs)
    if prefix:
        out.append(("Prefix caching on and off", prefix))
    spec = plots.speculative(runs)
    if spec:
        out.append(("Speculative decoding: speed-up and acceptance against k", spec))
    return out


def render(runs: list[Run], pricing: Path | None, checks: list[Check] | None = None) -> str:
    """The report's HTML for `runs`, priced with the models in `pricing` (default: the bundled file);
    with `checks`, the --fail-if verdict heads it."""
    models = load_pricing(pricing)
    blocks = [block for run in runs for block in cost_blocks(run, models)]
    env = Environment(autoescape=True)
    return env.from_string(TEMPLATE.read_text()).render(
        title=", ".join(r.name for r in runs),
        written=dt.datetime.now().isoformat(timespec="seconds"),
        runs=runs,
        run_settings=run_settings,
        point_headers=POINT_HEADERS,
        point_rows=point_rows,
        point_notes=point_notes,
        cost_source_lines=cost_source_lines,
        session_headers=SESSION_HEADERS,
        session_rows=session_rows,
        deltas=deltas(runs) if len(runs) > 1 else [],
        delta_metrics=DELTA_METRICS,
        figures=[(t, b64(svg)) for t, svg in figures(runs)],
        cost_blocks=blocks,
        habit_headers=HABIT_HEADERS,
        habit_tables=habit_tables(runs),
        server_metrics_headers=server_metrics_section.HEADERS,
        server_metric_rows=server_metrics_section.server_metric_rows,
        server_metrics_any=any(server_metrics_section.server_metric_rows(run) for run in runs),
        server_metrics_figure=optional_b64(server_metrics_section.figure(runs)),
        quantization=quantization_sections(runs, models),
        quantization_headers=QUANTIZATION_HEADERS,
        headline_headers=HEADLINE_HEADERS,
        headlines=headlines(runs, blocks),
        pricing_source=str(pricing or "llmopt/pricing.toml"),
        checks=checks,
        verdict_headers=VERDICT_HEADERS,
        verdict_cells=verdict_cells,
    )


def load_runs(run_dirs: list[Path]) -> list[Run]:
    runs = [load_run(Path(d)) for d in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    return runs


def write_report(run_dirs: list[Path], out: Path, pricing: Path | None = None) -> Path:
    """Write the report for the bench runs in `run_dirs` to `out` (replaced whole, never half-written)."""
    return write(load_runs(run_dirs), out, pricing)


def write(runs: list[Run], out: Path, pricing: Path | None = None, checks: list[Check] | None = None) -> Path:
    """Write the report of `runs` (and the verdict of `checks`) to `out`, replaced whole."""
    html = render(runs, pricing, checks)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(html)
    tmp.rename(out)
    return out
