"""The machine's memory read bandwidth, measured once per bench process where the server runs on this
machine: the best of several sums of a 256 MiB array (far beyond any last-level cache), split over every
core as a decode step's threads split their weights. A served point's decode reads (a step's weight
bytes, as the server publishes them, over the ITL) are set beside it in the summary and the report, so
they show how close to the machine's limit the point ran."""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ARRAY_BYTES = 256 * 2**20
PASSES = 5


@functools.cache  # the machine does not change within a run; measured before the first point needs it
def read_bandwidth_gbs() -> float:
    cores = os.cpu_count() or 1
    parts = np.array_split(np.ones(ARRAY_BYTES // 4, dtype=np.float32), cores)
    with ThreadPoolExecutor(cores) as pool:  # numpy's sums release the GIL: one part per core at once
        best = min(timed_pass(pool, parts) for _ in range(PASSES))
    return ARRAY_BYTES / best / 1e9


def timed_pass(pool: ThreadPoolExecutor, parts: list[np.ndarray]) -> float:
    began = time.perf_counter()
    list(pool.map(np.sum, parts))
    return time.perf_counter() - began
