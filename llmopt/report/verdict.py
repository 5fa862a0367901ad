"""`llmopt report BASE NEW --fail-if "ttft_p99>+10%,output_throughput<-5%"`: whether a change made any
matched load point worse than the conditions allow, for CI.

A condition holds at a point when the metric's change from BASE's matching point (same server, or the
same workload and load when the server names differ) passes the threshold. The change is judged by a
95 % bootstrap confidence interval: over the runs of a repeated point (`llmopt bench --num-runs N`
keeps each run's headline metrics, throughputs included), else, for a latency, over both points'
requests. The condition holds only when the whole interval is past the threshold, so noise alone does
not fail a build. The throughput of a point run once is one number, compared as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from llmopt.bench.schema import PointSummary
from llmopt.report.format import fmt
from llmopt.report.runs import Run

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "median", "p50", "p90", "p95", "p99")
THROUGHPUTS = ("output_throughput", "request_throughput", "total_token_throughput", "goodput")
BOOTSTRAP = 1000
MAX_SAMPLES = 2000  # per point: keeps a resampling of inter-token gaps within a few MB
CONDITION = re.compile(r"^\s*([a-z0-9_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


def metric_names() -> list[str]:
    return [f"{m}_{s}" for m in LATENCIES for s in STATS] + list(THROUGHPUTS)


@dataclass(frozen=True)
class Condition:
    metric: str  # "ttft_p99", "output_throughput", ...
    above: bool  # True: holds when the change exceeds the threshold (">"), False: when below ("<")
    threshold: float  # percent, signed: +10 for ">+10%", -5 for "<-5%"

    def __str__(self) -> str:
        return f"{self.metric}{'>' if self.above else '<'}{self.threshold:+g}%"


def parse_conditions(text: str) -> list[Condition]:
    """'ttft_p99>+10%,output_throughput<-5%' -> conditions; ValueError naming a bad one."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        match = CONDITION.match(part.lower())
        if not match:
            raise ValueError(f"--fail-if {part.strip()!r}: write METRIC>+N% or METRIC<-N%")
        metric, sign, threshold = match.groups()
        if metric not in metric_names():
            raise ValueError(f"--fail-if: unknown metric {metric!r}; one of {', '.join(metric_names())}")
        out.append(Condition(metric, sign == ">", float(threshold)))
    if not out:
        raise ValueError("--fail-if needs at least one condition")
    return out


@dataclass
class Check:
    """One condition at one matched point."""

    condition: Condition
    point: str
    base: float | None
    new: float | None
    change: float | None  # percent
    interval: tuple[float, float] | None  # 95 % bootstrap interval of the change, percent
    holds: bool


def point_value(point: PointSummary, metric: str) -> float | None:
    if metric in THROUGHPUTS:
        return point.figure(metric)
    name, _, stat = metric.partition("_")
    stat = "median" if stat == "p50" and "p50" not in (point.figure(f"{name}_ms") or {}) else stat
    return point.figure(f"{name}_ms", stat)


def value_of(point: PointSummary, metric: str, values: list[float] | None) -> float | None:
    """The point's own figure, or, for a statistic its summary does not hold (p95 of a run that kept
    p50, p90, p99), the statistic of its requests, in milliseconds as the summary's."""
    value = point_value(point, metric)
    if value is None and values:
        value = float(statistic(np.asarray(values), metric.partition("_")[2])) * 1000
    return value


def statistic(values: np.ndarray, stat: str) -> np.ndarray:
    """`stat` of each row of `values` (resamples x requests)."""
    if stat == "mean":
        return values.mean(axis=-1)
    q = 50.0 if stat in ("median", "p50") else float(stat[1:])
    return np.percentile(values, q, axis=-1)


def change_interval(base: list[float], new: list[float], stat: str) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of the relative change of `stat` from `base` to `new`, in percent."""
    if len(base) < 2 or len(new) < 2:
        return None
    rng = np.random.default_rng(0)  # the same runs always give the same verdict
    b = np.asarray(base)[rng.integers(0, len(base), (BOOTSTRAP, len(base)))]
    n = np.asarray(new)[rng.integers(0, len(new), (BOOTSTRAP, len(new)))]
    sb, sn = statistic(b, stat), statistic(n, stat)
    ok = sb > 0
    if not ok.any():
        return None
    changes = (sn[ok] - sb[ok]) / sb[ok] * 100
    return float(np.percentile(changes, 2.5)), float(np.percentile(changes, 97.5))


def samples(run: Run, point: PointSummary, metric: str) -> list[float] | None:
    """The per-request values (for ITL: the gaps) a latency metric is a statistic of; None for a
    throughput, which has one value per point."""
    if metric in THROUGHPUTS:
        return None
    name = metric.partition("_")[0]
    records = run.records_of(point.key)
    if name == "itl":
        values = [g for r in records for g in r.itl]
    elif name == "tpot":
        values = [
            (r.e2e - r.ttft) / (r.output_tokens - 1)
            for r in records
            if r.e2e is not None and r.ttft is not None and r.output_tokens >= 2
        ]
    else:
        values = [t for r in records if (t := r.ttft if name == "ttft" else r.e2e) is not None]
    if len(values) > MAX_SAMPLES:
        values = list(np.random.default_rng(0).choice(values, MAX_SAMPLES, replace=False))
    return values


def repeat_values(point: PointSummary, metric: str) -> list[float] | None:
    """The metric's value in each run of a repeated point (`llmopt bench --num-runs N`), where the
    bench kept them (its headline metrics), else None."""
    if metric in THROUGHPUTS:
        name = metric
    else:
        field, _, stat = metric.partition("_")
        name = f"{field}_ms.{'median' if stat == 'p50' else stat}"
    kept = point.repeats.metrics.get(name) if point.repeats is not None else None
    values = kept.values if kept is not None else None
    return values if values and len(values) > 1 else None


def check(condition: Condition, base_run: Run, base: PointSummary, new_run: Run, new: PointSummary) -> Check:
    label = f"{new_run.name}: {new.server} in {new.prompt_len} out {new.output_len} {new.load}"
    stat = condition.metric.partition("_")[2]
    old_samples = samples(base_run, base, condition.metric)
    new_samples = samples(new_run, new, condition.metric)
    old_value = value_of(base, condition.metric, old_samples)
    new_value = value_of(new, condition.metric, new_samples)
    if old_value is None or new_value is None or not old_value:
        return Check(condition, label, old_value, new_value, None, None, False)
    change = (new_value - old_value) / old_value * 100
    interval = None
    old_runs, new_runs = repeat_values(base, condition.metric), repeat_values(new, condition.metric)
    if old_runs is not None and new_runs is not None:  # repeated runs: their spread is the noise
        interval = change_interval(old_runs, new_runs, "mean")
    elif old_samples is not None and new_samples is not None:
        interval = change_interval(old_samples, new_samples, stat)
    low, high = interval if interval is not None else (change, change)
    holds = low > condition.threshold if condition.above else high < condition.threshold
    return Check(condition, label, old_value, new_value, change, interval, holds)


def matched_points(base: Run, new: Run) -> list[tuple[PointSummary, PointSummary]]:
    """(BASE point, NEW point) pairs: the same server, workload and load, or, where NEW's server is
    not in BASE, the same workload and load."""
    by_server = {(p.server, p.prompt_len, p.output_len, p.load): p for p in base.points}
    by_shape = {(p.prompt_len, p.output_len, p.load): p for p in base.points}
    servers = {p.server for p in base.points}
    pairs = []
    for p in new.points:
        if p.server in servers:
            ref = by_server.get((p.server, p.prompt_len, p.output_len, p.load))
        else:
            ref = by_shape.get((p.prompt_len, p.output_len, p.load))
        if ref is not None:
            pairs.append((ref, p))
    return pairs


def verdict(runs: list[Run], conditions: list[Condition]) -> list[Check]:
    """Every condition at every point of each later run matched in the first run."""
    base = runs[0]
    return [
        check(condition, base, ref, new_run, p)
        for new_run in runs[1:]
        for ref, p in matched_points(base, new_run)
        for condition in conditions
    ]


VERDICT_HEADERS = [
    "condition",
    "point",
    "BASE",
    "NEW",
    "change (%)",
    "95 % interval of the change (%)",
    "verdict",
]


def verdict_cells(c: Check) -> list[str]:
    """A check as the console's and the report's verdict tables show it."""
    interval = f"{c.interval[0]:+.1f} to {c.interval[1]:+.1f}" if c.interval else "-"
    change = f"{c.change:+.1f}" if c.change is not None else "-"
    state = "FAILS" if c.holds else ("no value" if c.change is None else "ok")
    unit = unit_of(c.condition.metric)
    base, new = (f"{fmt(v, 2)} {unit}" if v is not None else "-" for v in (c.base, c.new))
    return [str(c.condition), c.point, base, new, change, interval, state]


def unit_of(metric: str) -> str:
    if metric in THROUGHPUTS:
        return "tok/s" if metric in ("output_throughput", "total_token_throughput") else "req/s"
    return "ms"
