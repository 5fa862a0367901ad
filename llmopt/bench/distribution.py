"""A distribution's figures: mean, median and percentiles of a list of values. The measures summarise
latencies with it and the client's self-check its event-loop lag, so it sits below both wings."""

from __future__ import annotations

import numpy as np

DEFAULT_PERCENTILES = (50, 90, 99)


def distribution(
    values: list[float], percentiles: tuple[float, ...], scale: float = 1000.0
) -> dict[str, float]:
    """Mean, median and percentiles, in milliseconds by default; NaN-free (None when empty)."""
    if not values:
        return {"mean": None, "median": None, **{f"p{p:g}": None for p in percentiles}}
    arr = np.asarray(values) * scale
    out = {"mean": float(arr.mean()), "median": float(np.median(arr))}
    out.update({f"p{p:g}": float(np.percentile(arr, p)) for p in percentiles})
    return out
