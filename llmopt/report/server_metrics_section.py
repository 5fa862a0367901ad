"""The report's server-metrics section: what the server said about itself during each point (its
/metrics sampled by the bench, bench/observe/server_metrics.py) as a table row per point, and for the busiest
points its running and waiting requests, KV cache use, prefix-cache hit rate and speculation acceptance
over time, drawn beside the client's per-request timeline of the same point: a point that was slow
shows whether requests queued, the KV cache filled, or the cache missed. Every engine's figures are in
the bench's one set of names (bench/observe/metric_names.py), so llmopt, vLLM and llama.cpp points share one
table; a figure an engine does not publish reads "-"."""

from __future__ import annotations

import matplotlib.pyplot as plt

from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, ServerFigures
from llmopt.report.format import fmt
from llmopt.report.plots import draw_timeline, to_svg
from llmopt.report.runs import Run, load_value

HEADERS = [
    "server",
    "in (tokens)",
    "load",
    "metrics of",
    "samples",
    "running mean (requests)",
    "running max (requests)",
    "waiting max (requests)",
    "KV cache usage mean (%)",
    "KV cache usage max (%)",
    "prefix-cache hit rate (%)",
    "preemptions (requests)",
    "spec acceptance (%)",
]


def percent(value: float | None) -> str:
    return fmt(None if value is None else 100 * value, 1)


def server_metric_row(point: PointSummary, m: ServerFigures) -> list[str]:
    """One point's row from its summary's server figures `m` (today's names)."""
    counts = [fmt(m.running_mean, 1), fmt(m.running_max, 0), fmt(m.waiting_max, 0)]
    usage = [percent(m.kv_cache_usage_mean), percent(m.kv_cache_usage_max)]
    rates = [percent(m.prefix_cache_hit_rate), fmt(m.preemptions, 0)]
    name = [point.server, str(point.prompt_len), point.load, m.engine or "-"]
    return [*name, str(m.samples), *counts, *usage, *rates, percent(m.spec_acceptance)]


def server_metric_rows(run: Run) -> list[list[str]]:
    """A row per point whose server was sampled, whichever engine it was."""
    return [server_metric_row(p, p.server_metrics) for p in run.points if p.server_metrics]


def samples_of(run: Run) -> dict[str, list[dict]]:
    """The first run of each point's samples (a point run several times overlays its runs' records, but
    the server's series are drawn for one run), by point key."""
    out: dict[str, list[dict]] = {}
    for sample in RunDir(run.path).read_server_metrics():
        if sample.get("run", 0) == 0:
            out.setdefault(sample["point"], []).append(sample)
    return out


def chosen_points(runs: list[Run], max_points: int) -> list[tuple[Run, PointSummary, list[dict]]]:
    """Each series' busiest point that has samples, up to `max_points`, with its samples."""
    chosen = []
    for run in runs:
        samples = samples_of(run)
        for pts in run.series().values():
            sampled = [p for p in pts if samples.get(p.key)]
            if sampled:
                point = max(sampled, key=load_value)
                chosen.append((run, point, samples[point.key]))
    return chosen[:max_points]


def in_flight(records: list[RequestRecord], t: float) -> int:
    """The client's requests in flight at `t` (seconds since the point started)."""
    return sum(1 for r in records if r.e2e is not None and r.start <= t < r.start + r.e2e)


def series(samples: list[dict], field: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    found = [(s["t"], s[field] * scale) for s in samples if s.get(field) is not None]
    return [t for t, _ in found], [v for _, v in found]


def figure(runs: list[Run], max_points: int = 4) -> str | None:
    """A row per chosen point: the client's timeline, the server's running and waiting requests (and
    the client's own count in flight), and its KV use, prefix-cache hits and acceptance in %."""
    chosen = chosen_points(runs, max_points)
    if not chosen:
        return None
    fig, axes = plt.subplots(len(chosen), 3, figsize=(15, 3.6 * len(chosen)), squeeze=False)
    for (ax_client, ax_queue, ax_share), (run, p, samples) in zip(axes, chosen):
        records = run.records_of(p.key)
        draw_timeline(ax_client, records)
        name = f"{run.name + ' / ' if len(runs) > 1 else ''}{p.server} in {p.prompt_len} {p.load}"
        ax_client.set_title(f"client: {name}", fontsize=9)
        for field, style in (("running", "-"), ("waiting", "--")):
            ax_queue.step(*series(samples, field), style, where="post", label=f"server: {field}")
        times = [s["t"] for s in samples]
        client = [in_flight(records, t) for t in times]
        ax_queue.step(times, client, ":", where="post", label="client: in flight")
        ax_queue.set_ylabel("requests")
        ax_queue.set_title("server: requests running and waiting", fontsize=9)
        for field, label in (
            ("kv_cache_usage", "KV cache usage"),
            ("prefix_cache_hit_rate", "prefix-cache hit rate"),
            ("spec_acceptance", "spec acceptance"),
        ):
            xs, ys = series(samples, field, 100)
            if xs:
                ax_share.plot(xs, ys, marker="." if len(xs) > 1 else "o", label=label)
        ax_share.set_ylim(-2, 102)
        ax_share.set_ylabel("%")
        ax_share.set_title("server: KV cache and hit rates (over each interval)", fontsize=9)
        for ax in (ax_queue, ax_share):
            if records:
                ax.set_xlim(ax_client.get_xlim())  # the same seconds as the client's timeline
            ax.set_xlabel("seconds since the point started")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    axes[0][0].legend(fontsize=7, loc="lower right")
    return to_svg(fig)
