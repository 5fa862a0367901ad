"""matplotlib figures of bench runs, returned as SVG text (inlined into the report, nothing fetched)."""

from __future__ import annotations

import io
import json

import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from llmopt.bench.schema import PointSummary, RequestRecord  # noqa: E402
from llmopt.cost.break_even import conversation_cost, max_turns  # noqa: E402
from llmopt.cost.conversation_shape import ConversationShape  # noqa: E402
from llmopt.pricing import PricingModel, Usage  # noqa: E402
from llmopt.report.runs import Run, load_value  # noqa: E402

STYLES = {"p50": "-", "p90": "--", "p99": ":"}
# Cost plots: token prices in colour, prices per request dotted in one dark grey, told apart by marker.
FLAT_COLOR = "0.25"
FLAT_MARKERS = ("s", "^", "v", "D", "P", "o")


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
    names = {
        "concurrency": "concurrency",
        "request_rate": "request rate (req/s)",
        "sessions": "sessions at once",
        "session_rate": "session rate (sessions/s)",
        "replay_speed": "replay speed (x the trace's)",
    }
    used = [
        name for key, name in names.items() if any(p.figure(key) is not None for r in runs for p in r.points)
    ]
    return " / ".join(used) or "concurrency"


def throughput(runs: list[Run]) -> str:
    fig, (ax_tok, ax_req) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        for key, pts in run.series().items():
            x = [load_value(p) for p in pts]
            name = label(run, key, len(runs) > 1)
            for ax, metric in ((ax_tok, "output_throughput"), (ax_req, "request_throughput")):
                y = [p.figure(metric) for p in pts]
                (line,) = ax.plot(x, y, marker="o", label=name)
                error_bars(ax, x, y, pts, metric, line.get_color())
    for ax, title in ((ax_tok, "output tokens/s"), (ax_req, "requests/s")):
        ax.set_xlabel(load_axis_name(runs))
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_tok.legend(fontsize=7)
    return to_svg(fig)


def error_bars(ax, x: list, y: list, pts: list[PointSummary], metric: str, color: str) -> None:
    """The 95 % interval of `metric` at each point run several times (--num-runs), around its value."""
    cis = [p.repeats.metrics.get(metric) if p.repeats is not None else None for p in pts]
    if not any(cis):
        return
    low = [max(0.0, v - c.ci95[0]) if c else 0.0 for v, c in zip(y, cis)]
    high = [max(0.0, c.ci95[1] - v) if c else 0.0 for v, c in zip(y, cis)]
    ax.errorbar(x, y, yerr=[low, high], fmt="none", ecolor=color, capsize=3)


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
                    y = [p.figure(metric, pct) for p in pts]
                    if any(v is not None for v in y):
                        ax.plot(
                            x,
                            y,
                            style,
                            color=color,
                            marker="o" if len(x) == 1 else ".",  # one point: a dot no line joins
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
                figures = [(p.output_throughput, p.figure(metric, pct)) for p in pts]
                xy = [(x, y) for x, y in figures if y is not None]
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
            recs = run.records_of(p.key)
            if not recs or lines >= max_lines:
                continue
            lines += 1
            name = f"{run.name + ' / ' if len(runs) > 1 else ''}{p.server} in {p.prompt_len} {p.load}"
            for ax, times in ((axes[0], [r.ttft for r in recs]), (axes[1], [r.e2e for r in recs])):
                values = np.sort([t * 1000 for t in times if t is not None])
                marker = "o" if len(values) == 1 else None  # a lone request: no line to see
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), marker=marker, label=name)
    for ax, title in zip(axes, ("TTFT (ms)", "E2E latency (ms)")):
        ax.set_title(f"CDF of {title}")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    return to_svg(fig)


def turns(runs: list[Run]) -> str | None:
    """Multi-turn points: TTFT and E2E medians and the prefix-cached share of the prompt by turn index."""
    series = [(run, p) for run in runs for p in run.points if p.turns]
    if not series:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for run, p in series:
        name = f"{run.name + ' / ' if len(runs) > 1 else ''}{p.server} {p.load}"
        ks = [t.turn for t in p.turns]
        axes[0].plot(ks, [t.ttft_ms["median"] for t in p.turns], marker="o", label=name)
        axes[1].plot(ks, [t.e2e_ms["median"] for t in p.turns], marker="o", label=name)
        cached = [t.cached_fraction for t in p.turns]
        if any(c is not None for c in cached):
            axes[2].plot(ks, [100 * c if c is not None else None for c in cached], marker="o", label=name)
    for ax, title in zip(
        axes, ("TTFT median (ms)", "E2E median (ms)", "prompt served from the prefix cache (%)")
    ):
        ax.set_title(title)
        ax.set_xlabel("turn (0 = first)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    return to_svg(fig)


def prefix_caching(runs: list[Run]) -> str | None:
    """TTFT with and without prefix caching, where a sweep varied it."""
    bars = []
    for run in runs:
        for p in run.points:
            args = p.server_args or {}
            flag = args.get("enable-prefix-caching", args.get("enable_prefix_caching"))
            if flag is not None:
                bars.append((f"{p.load}\nin {p.prompt_len}", "on" if flag else "off", p.ttft_ms["median"]))
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
            (p.prompt_len, p.output_len, p.load): p.output_throughput
            for p in run.points
            if p.server_args is not None and not p.server_args.get("speculative-config")
        }
        for p in run.points:
            spec = (p.server_args or {}).get("speculative-config")
            if not spec:
                continue
            spec = json.loads(spec) if isinstance(spec, str) else spec
            ref = base.get((p.prompt_len, p.output_len, p.load))
            acceptance = (p.spec or {}).get("acceptance_rate")
            rows.append(
                (
                    spec.get("method"),
                    spec.get("num_speculative_tokens"),
                    p.load,
                    p.output_throughput / ref if ref else None,
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
    tokens: list[PricingModel],
    flats: list[tuple[PricingModel, float]],
    output_tokens: float,
    run_prompt_lens: list[float],
) -> str:
    """$ per request against prompt length: token prices rise, prices per request stay flat (a plan's
    line ends at its prompt cap); the run's prompt lengths marked."""
    top = max([8192.0] + [2 * p for p in run_prompt_lens])
    x = np.linspace(0, top, 200)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for m in tokens:
        ax.plot(x, [m.request_cost(Usage(p, output_tokens)) for p in x], label=f"{m.name} (per token)")
    for j, (m, price) in enumerate(flats):
        end = min(top, m.max_input_tokens) if m.max_input_tokens is not None else top
        style = {"color": FLAT_COLOR, "marker": FLAT_MARKERS[j % len(FLAT_MARKERS)], "markevery": [0]}
        ax.plot([0, end], [price, price], ":", label=f"{m.name} ({m.kind})", **style)
        if end < top:
            ax.plot([end], [price], "x", color="black")
    ax.set_yscale("log")
    for p in run_prompt_lens:
        ax.axvline(p, color="grey", lw=0.8, alpha=0.7)
    ax.set_xlabel(f"prompt tokens per request (output {output_tokens:,.0f} tokens; grey: the run's)")
    ax.set_ylabel("$ per request")
    ax.set_title("cost per request against prompt length (x: a plan's token cap)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return to_svg(fig)


def cost_vs_turns(
    tokens: list[PricingModel], flats: list[tuple[PricingModel, float]], shape: ConversationShape
) -> str:
    """$ per conversation against its turns: under token prices it grows with the square of the turns
    (history replayed; dashed: with the run's cached share at the cached price), under prices per request
    linearly (a plan's line ends where its token caps stop the conversation)."""
    top = max(20, 2 * shape.turns)
    turns = np.arange(1, top + 1)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    uncached = ConversationShape(shape.prompt_tokens, shape.output_tokens)
    for i, m in enumerate(tokens):
        color = f"C{i % 10}"
        costs = [conversation_cost(m, uncached.with_turns(int(t))) for t in turns]
        ax.plot(turns, costs, color=color, label=f"{m.name} (per token)")
        if shape.cached_fraction > 0 and m.cached_input_per_1m is not None:
            cached = [conversation_cost(m, shape.with_turns(int(t))) for t in turns]
            ax.plot(turns, cached, "--", color=color, label=f"{m.name}, {shape.cached_fraction:.0%} cached")
    for j, (m, price) in enumerate(flats):
        cap = max_turns(m, shape)
        last = top if cap is None else min(top, cap)
        if last < 1:
            continue
        x = turns[:last]
        style = {"color": FLAT_COLOR, "marker": FLAT_MARKERS[j % len(FLAT_MARKERS)], "markevery": 4}
        ax.plot(x, price * x, ":", label=f"{m.name} ({m.kind})", **style)
        if last < top:
            ax.plot([last], [price * last], "x", color="black", markersize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.axvline(shape.turns, color="grey", lw=0.8, alpha=0.7)
    ax.set_yscale("log")
    ax.set_xlabel(f"turns per conversation (grey: the run's {shape.turns})")
    ax.set_ylabel("$ per conversation")
    ax.set_title("cost per conversation against turns (x: a plan's caps end the conversation)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return to_svg(fig)


def timeline(runs: list[Run], max_points: int = 4) -> str | None:
    """Each request of a run's busiest points as a bar from when it was sent to its last byte, the wait
    for its first token darker (as `vllm bench serve --plot-timeline` draws): queueing and slow
    prefills show as long dark heads."""
    chosen = []
    for run in runs:
        for pts in run.series().values():
            chosen.append((run, max(pts, key=load_value)))
    chosen = [(run, p) for run, p in chosen if run.records_of(p.key)][:max_points]
    if not chosen:
        return None
    fig, axes = plt.subplots(1, len(chosen), figsize=(5 * len(chosen), 4), squeeze=False)
    for ax, (run, p) in zip(axes[0], chosen):
        draw_timeline(ax, run.records_of(p.key))
        ax.set_title(f"{run.name + ' / ' if len(runs) > 1 else ''}{p.server} in {p.prompt_len} {p.load}")
    axes[0][0].legend(fontsize=7, loc="lower right")
    return to_svg(fig)


def draw_timeline(ax, records: list[RequestRecord]) -> None:
    """One point's requests on `ax`, a bar each from sent to last byte, the wait for the first token
    darker (the timeline plot's, and the server-metrics plot's left panel)."""
    recs = sorted(
        (r for r in records if r.ttft is not None and r.e2e is not None),
        key=lambda r: r.start,
    )
    y = np.arange(len(recs))
    starts = np.array([r.start for r in recs])
    ttft = np.array([r.ttft for r in recs])
    e2e = np.array([r.e2e for r in recs])
    ax.barh(y, ttft, left=starts, height=0.8, color="C3", label="sent -> first token")
    ax.barh(y, e2e - ttft, left=starts + ttft, height=0.8, color="C0", alpha=0.6, label="first -> last token")
    ax.set_xlabel("seconds since the point started")
    ax.set_ylabel("request (by start)")
    ax.grid(alpha=0.3, axis="x")


def quality_tradeoff(
    names: list[str],
    quality: list[float | None],
    quality_label: str,
    panels: list[tuple[str, list[float | None], list[bool]]],
) -> str:
    """Quality (its label; lower is better: a KL divergence or a perplexity) against each panel's x (its
    label, a value per config, and which configs are on that panel's Pareto front): one labelled marker
    per config, the front stepped."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (xlabel, xs, front) in zip(axes[0], panels):
        drawn = [(x, y, n, f) for x, y, n, f in zip(xs, quality, names, front) if x and y is not None]
        for i, (x, y, name, on) in enumerate(drawn):
            ax.plot([x], [y], marker="o" if on else "x", ls="none", color=f"C{i % 10}", ms=8, label=name)
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        edge = sorted((x, y) for x, y, _, on in drawn if on)
        if len(edge) > 1:
            ax.step(*zip(*edge), where="post", color="black", lw=1, alpha=0.6, label="Pareto front")
        ax.set_xlabel(xlabel.replace("$", r"\$"))  # a dollar sign is no mathtext here
        ax.set_ylabel(f"{quality_label} (lower is better)")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    return to_svg(fig)
