"""How sure a repeated point is: with `--num-runs N` every point runs N times (fresh prompts each time);
its summary pools the runs' records, and for each headline metric gives the runs' values, their mean and
a 95 % confidence interval of that mean, bootstrapped over the runs (resampled with replacement)."""

from __future__ import annotations

import numpy as np

from llmopt.bench.load.load_point import PointResult
from llmopt.bench.measure.request_metrics import summarize_results

# (summary field, statistic or None): the metrics a repeated point gives an interval for.
HEADLINE = [
    ("request_throughput", None),
    ("output_throughput", None),
    ("goodput", None),
    ("ttft_ms", "median"),
    ("ttft_ms", "p99"),
    ("tpot_ms", "median"),
    ("itl_ms", "median"),
    ("e2e_ms", "median"),
]
RESAMPLES = 2000


def bootstrap_ci(values: list[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The interval holding `confidence` of the means of resamples of `values` (one value: itself)."""
    assert values, "an interval needs at least one value"
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = rng.choice(data, size=(RESAMPLES, len(data)), replace=True).mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def headline_value(summary: dict, field: str, stat: str | None) -> float | None:
    value = summary.get(field)
    return (value or {}).get(stat) if stat else value


def repeat_stats(runs: list[dict]) -> dict:
    """{"runs": N, "metrics": {"ttft_ms.median": {"values", "mean", "ci95", "spread"}, ...}} of one
    point's runs' summaries (or its rounds', rounds.py), spread the highest value less the lowest; a
    metric that some run lacks (no SLO, no successful request) is left out."""
    metrics = {}
    for field, stat in HEADLINE:
        values = [headline_value(run, field, stat) for run in runs]
        if not values or any(v is None for v in values):
            continue
        low, high = bootstrap_ci(values)
        name = f"{field}.{stat}" if stat else field
        mean, spread = float(np.mean(values)), float(max(values) - min(values))
        metrics[name] = {"values": values, "mean": mean, "ci95": [low, high], "spread": spread}
    return {"runs": len(runs), "metrics": metrics}


def repeat_summary(
    repeats: list[list[PointResult]], slo: dict[str, float], percentiles: tuple[float, ...]
) -> dict:
    """A repeated point's `repeats` block: `repeat_stats` over the figures of each repeat (a run's
    results, or a round's runs' pooled)."""
    return repeat_stats([summarize_results(results, slo, percentiles) for results in repeats])
