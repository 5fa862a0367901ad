"""matplotlib figures of bench runs, returned as SVG text (inlined into the report, nothing fetched)."""

from __future__ import annotations

import io
import json

import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from llmopt.pricing import PricingModel  # noqa: E402
from llmopt.report.data import Run, load_value  # noqa: E402

STYLES = {"p50": "-", "p90": "--", "p99": ":"}


def to_svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def label(run: Run, key: tuple[str, int, int], several_runs: bool) -> str:
    server, prompt_len, output_len = key
    prefix = f"{run.name} / " if several_runs else ""
    return f"{prefix}{server} (in {prompt_len}, out {output_len})"


def load_axis_name(runs: list[Run]) -> str:
    rate = any(p["request_rate"] is not None for r in runs for p in r.points)
    conc = any(p["concurrency"] is not None for r in runs for p in r.points)
    return (
        "concurrency / request rate (req/s)"
        if rate and conc
        else ("request rate (req/s)" if rate else "concurrency")
    )


def throughput(runs: list[Run]) -> str:
    fig, (ax_tok, ax_req) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        for key, pts in run.series().items():
            x = [load_value(p) for p in pts]
            name = label(run, key, len(runs) > 1)
            ax_tok.plot(x, [p["output_throughput"] for p in pts], marker="o", label=name)
            ax_req.plot(x, [p["request_throughput"] for p in pts], marker="o", label=name)
    for ax, title in ((ax_tok, "output tokens/s"), (ax_req, "requests/s")):
        ax.set_xlabel(load_axis_name(runs))
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_tok.legend(fontsize=7)
    return to_svg(fig)


def latency(runs: list[Run]) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric, title in zip(
        axes, ("ttft_ms", "tpot_ms", "itl_ms"), ("TTFT (ms)", "TPOT (ms)", "ITL (ms)")
    ):
        for i, run in enumerate(runs):
            for j, (key, pts) in enumerate(run.series().items()):
                color = f"C{(i * 4 + j) % 10}"
                x = [load_value(p) for p in pts]
                for pct, style in STYLES.items():
                    y = [p[metric].get(pct) for p in pts]
                    if any(v is not None for v in y):
                        ax.plot(
                            x,
                            y,
                            style,
                            color=color,
                            marker=".",
                            label=f"{label(run, key, len(runs) > 1)} {pct}",
                        )
        ax.set_title(title)
        ax.set_xlabel(load_axis_name(runs))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    return to_svg(fig)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both throughput (higher) and latency (lower)."""
    front, best = [], float("inf")
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    return sorted(front)


def latency_throughput(runs: list[Run], slo_ms: dict[str, float]) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, pct, title in (
        (axes[0], "tpot_ms", "median", "TPOT median (ms)"),
        (axes[1], "ttft_ms", "p99", "TTFT p99 (ms)"),
    ):
        everything = []
        for run in runs:
            for key, pts in run.series().items():
                xy = [(p["output_throughput"], p[metric][pct]) for p in pts if p[metric][pct] is not None]
                if xy:
                    ax.plot(*zip(*xy), marker="o", alpha=0.8, label=label(run, key, len(runs) > 1))
                    everything += xy
        front = pareto_front(everything)
        if len(front) > 1:
            ax.step(*zip(*front), where="post", color="black", lw=1, alpha=0.6, label="Pareto front")
        slo = slo_ms.get(metric.split("_")[0])
        if slo:
            ax.axhline(slo, color="red", ls="--", lw=1, label=f"SLO {slo:g} ms")
        ax.set_xlabel("output tokens/s")
        ax.set_title(f"latency vs throughput: {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return to_svg(fig)


def cdfs(runs: list[Run], max_lines: int = 10) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    lines = 0
    for run in runs:
        for p in run.points:
            recs = run.records_of(p["key"])
            if not recs or lines >= max_lines:
                continue
            lines += 1
            name = (
                f"{run.name + ' / ' if len(runs) > 1 else ''}{p['server']} in {p['prompt_len']} {p['load']}"
            )
            for ax, field in ((axes[0], "ttft"), (axes[1], "e2e")):
                values = np.sort([r[field] * 1000 for r in recs if r.get(field) is not None])
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=name)
    for ax, title in zip(axes, ("TTFT (ms)", "E2E latency (ms)")):
        ax.set_title(f"CDF of {title}")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    return to_svg(fig)


def prefix_caching(runs: list[Run]) -> str | None:
    """TTFT with and without prefix caching, where a sweep varied it."""
    bars = []
    for run in runs:
        for p in run.points:
            args = p.get("server_args") or {}
            flag = args.get("enable-prefix-caching", args.get("enable_prefix_caching"))
            if flag is not None:
                bars.append(
                    (f"{p['load']}\nin {p['prompt_len']}", "on" if flag else "off", p["ttft_ms"]["median"])
                )
    if not {b[1] for b in bars} >= {"on", "off"}:
        return None
    loads = sorted({b[0] for b in bars})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for i, state in enumerate(("on", "off")):
        values = [next((b[2] for b in bars if b[0] == load and b[1] == state), 0) or 0 for load in loads]
        ax.bar(np.arange(len(loads)) + (i - 0.5) * width, values, width, label=f"prefix caching {state}")
    ax.set_xticks(np.arange(len(loads)), loads, fontsize=8)
    ax.set_ylabel("TTFT median (ms)")
    ax.set_title("prefix caching: time to first token")
    ax.legend()
    return to_svg(fig)


def speculative(runs: list[Run]) -> str | None:
    """Speed-up over the same sweep's server without speculation, and acceptance rate, against k."""
    rows = []  # (method, k, load label, speed-up, acceptance)
    for run in runs:
        base = {
            (p["prompt_len"], p["output_len"], p["load"]): p["output_throughput"]
            for p in run.points
            if p.get("server_args") is not None and not (p["server_args"] or {}).get("speculative-config")
        }
        for p in run.points:
            spec = (p.get("server_args") or {}).get("speculative-config")
            if not spec:
                continue
            spec = json.loads(spec) if isinstance(spec, str) else spec
            ref = base.get((p["prompt_len"], p["output_len"], p["load"]))
            acceptance = (p.get("spec") or {}).get("acceptance_rate")
            rows.append(
                (
                    spec.get("method"),
                    spec.get("num_speculative_tokens"),
                    p["load"],
                    p["output_throughput"] / ref if ref else None,
                    acceptance,
                )
            )
    if not rows:
        return None
    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for method, load in sorted({(r[0], r[2]) for r in rows}):
        pts = sorted((r[1], r[3], r[4]) for r in rows if r[0] == method and r[2] == load)
        ks = [k for k, _, _ in pts]
        if any(s is not None for _, s, _ in pts):
            ax_speed.plot(ks, [s for _, s, _ in pts], marker="o", label=f"{method}, {load}")
        if any(a is not None for _, _, a in pts):
            ax_acc.plot(ks, [a for _, _, a in pts], marker="o", label=f"{method}, {load}")
    ax_speed.axhline(1.0, color="grey", lw=0.8)
    ax_speed.set_title("speed-up over no speculation (output tok/s)")
    ax_acc.set_title("acceptance rate of proposed tokens")
    for ax in (ax_speed, ax_acc):
        ax.set_xlabel("k (num_speculative_tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return to_svg(fig)


def cost_vs_prompt_length(
    models: list[PricingModel],
    output_tokens: float,
    run_prompt_lens: list[float],
    request_throughput: float | None,
) -> str:
    top = max([8192.0] + [2 * p for p in run_prompt_lens])
    x = np.linspace(0, top, 200)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for m in models:
        if m.kind == "token":
            ax.plot(x, [m.cost_per_request(p, output_tokens) for p in x], label=f"{m.name} (per token)")
        elif m.kind == "request":
            ax.plot(x, [m.per_request] * len(x), "--", label=f"{m.name} (per request)")
        elif request_throughput:
            cost = m.cost_per_request(0, output_tokens, request_throughput)
            ax.plot(x, [cost] * len(x), ":", label=f"{m.name} (self-hosted at the measured req/s)")
    for p in run_prompt_lens:
        ax.axvline(p, color="grey", lw=0.8, alpha=0.7)
        ax.text(p, ax.get_ylim()[1] * 0.95, f" run: {p:.0f}", fontsize=7, color="grey", va="top")
    ax.set_yscale("log")
    ax.set_xlabel(f"prompt tokens (output {output_tokens:.0f} tokens)")
    ax.set_ylabel("$ per request")
    ax.set_title("cost per request against prompt length")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return to_svg(fig)
