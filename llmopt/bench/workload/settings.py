"""The settings a workload is made from, as the workloads read them. The sweep's BenchConfig has them
all; naming them here as a Protocol keeps the workloads from importing the sweep (the arrow runs from
the sweep down to the workloads, never back)."""

from __future__ import annotations

from typing import Protocol


class WorkloadSettings(Protocol):
    workload: str  # a name of WORKLOADS
    num_requests: int
    prompt_len_spread: float
    prefix_len: int
    num_prefixes: int
    dataset: str | None
    trace: str | None
    trace_block_size: int
    system_len: int
    turns: int
    agent_tools: str
