"""When an open-loop point sends: arrival times at a rate, constant, Poisson, or gamma with a burstiness
factor (as `vllm bench serve`: gaps drawn from Gamma(shape=burstiness, scale=1 / (rate * burstiness)),
so the mean gap stays 1 / rate; 1.0 is Poisson, below it burstier, above it steadier), optionally after a
linear ramp-up of the rate from 0."""

from __future__ import annotations

import math
import random

ARRIVALS = ("poisson", "constant")


def arrival_times(
    n: int,
    rate: float,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    ramp_up_s: float = 0.0,
    seed: int = 0,
) -> list[float]:
    """The send times of `n` arrivals, in seconds after the point's start (the first at 0)."""
    assert rate > 0 and burstiness > 0 and ramp_up_s >= 0 and arrival in ARRIVALS
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        if arrival == "constant":
            now += 1 / rate
        elif burstiness == 1.0:
            now += rng.expovariate(rate)  # the draws earlier benches made for the same seed
        else:
            now += rng.gammavariate(burstiness, 1 / (rate * burstiness))
    return [ramped(t, ramp_up_s) for t in times] if ramp_up_s else times


def ramped(s: float, ramp_up_s: float) -> float:
    """The time of the arrival that comes at `s` at the full rate, when the rate instead grows linearly
    from 0 to full over the first `ramp_up_s` seconds.

    A change of time: arrivals at the full rate r up to s number r * s; under the ramp they number
    r * t^2 / (2 R) up to t < R, and r * (t - R / 2) after. Equal counts give the time, whatever the
    arrival process (constant, Poisson, gamma) keeps its shape, only stretched."""
    if s < ramp_up_s / 2:
        return math.sqrt(2 * ramp_up_s * s)
    return s + ramp_up_s / 2
