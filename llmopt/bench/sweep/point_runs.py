"""The runs of one point of a sweep's matrix: each on fresh prompts seeded by the point's place in the
matrix and the run's number, after resetting the server's prefix cache, with the server's /metrics
sampled over it and a local llmopt server's speculation counters read before and after them all. Single
requests run through runner.run_point, a multi-turn workload's sessions through runner.run_sessions."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from typing import TYPE_CHECKING

from llmopt.bench.load.client import Target
from llmopt.bench.load.load_point import LoadPoint, Measured, PointResult, Run
from llmopt.bench.load.runner import run_point, run_sessions
from llmopt.bench.load.token_count import TokenCounter, tokenize_url
from llmopt.bench.observe.machine_meter import machine_meter
from llmopt.bench.observe.prefix_cache import cache_warnings, reset_prefix_cache
from llmopt.bench.observe.server_metrics import MetricsSampler
from llmopt.bench.observe.server_stats import scrape_spec_counters, spec_delta
from llmopt.bench.sweep.matrix import Cell, point_key
from llmopt.bench.workload import (
    REPEATING_WORKLOADS,
    SESSION_WORKLOADS,
    count_tokens,
    make_conversations,
    make_requests,
    random_prompts,
)
from llmopt.bench.workload.conversation import Conversation

if TYPE_CHECKING:
    from llmopt.bench.servers.server_spec import ServerSpec
    from llmopt.bench.sweep.bench_config import BenchConfig
    from llmopt.bench.sweep.sweep_state import Sweep


def measure(
    sweep: Sweep,
    target: Target,
    server_name: str,
    spec: ServerSpec | None,
    index: int,
    cell: Cell,
    repeats: range,
) -> Measured:
    """The runs of a point numbered `repeats` (each number seeds its run's prompts)."""
    key = point_key(server_name, *cell)
    target = dataclasses.replace(
        target, stream=cell[2].stream, connection_reuse=sweep.config.load.connection_reuse
    )
    local = spec is not None  # only a local llmopt server is asked for its speculation counters
    before = scrape_spec_counters(target.endpoint) if local else None
    runs = [run_once(sweep, target, key, index, cell, repeat) for repeat in repeats]
    grown = spec_delta(before, scrape_spec_counters(target.endpoint)) if before is not None else None
    return Measured(runs, grown)


def run_once(sweep: Sweep, target: Target, key: str, index: int, cell: Cell, repeat: int) -> Run:
    """One run of a point, after resetting the prefix cache."""
    config, tokenizer = sweep.config, sweep.tokenizer
    prompt_len, output_len, point = cell
    if (
        config.load.rounds > 1
    ):  # its records say which run they are of (rounds.py: --resume keeps finished rounds)
        point = dataclasses.replace(point, run=repeat)
        cell = (prompt_len, output_len, point)
    # Fresh prompts for every point, run and warm-up, so that none is served from prefix-cache entries
    # that an earlier one left behind; a point's place in the matrix seeds them (resume sends the same).
    seed = config.workload.seed + 7919 * index + 104729 * repeat
    # Counts a server's answer leaves out: from its /tokenize where it has one, else the local tokenizer.
    count = TokenCounter(
        functools.partial(count_tokens, tokenizer) if tokenizer is not None else None,
        tokenize_url(target.endpoint),
        target.model,
        target.headers(),
    )
    reset, warnings = cache_hygiene(config, target, index + repeat, point)
    planned: dict[int, int] = {}
    with MetricsSampler(
        target.endpoint.rstrip("/").removesuffix("/v1"), config.load.metrics_interval
    ) as sampler:
        if config.workload.kind in SESSION_WORKLOADS:
            result, planned = run_sessions_cell(sweep, target, key, cell, seed, count, repeat)
        else:
            workload = config.workload
            requests = make_requests(
                workload, tokenizer, prompt_len, output_len, seed, config.load.num_requests
            )
            if point.warmup:
                point.warmup_requests = make_requests(
                    workload, tokenizer, prompt_len, output_len, seed + 1, point.warmup
                )
            progress = sweep.on_point_start(key, point) if sweep.on_point_start else None
            meter = machine_meter(target)
            result = asyncio.run(
                run_point(target, requests, point, sweep.records_out, key, progress, count, meter)
            )
        ended = time.perf_counter()
    # Sample times count from the point's start, as its records' do (else from where it must have been).
    samples = sampler.samples(result.started if result.started is not None else ended - result.wall_s)
    sweep.run.append_server_metrics([{"point": key, "run": repeat, **s.to_json()} for s in samples])
    return Run(result, planned, reset, warnings, samples, repeat)


def cache_hygiene(
    config: BenchConfig, target: Target, earlier: int, point: LoadPoint
) -> tuple[bool | None, list[str]]:
    """Before a run: reset the server's prefix cache (None: not asked to), and say what may still serve
    it from a cache (prefix_cache.py); `earlier` counts the points and runs this server ran before."""
    reset = None
    if config.load.reset_prefix_cache:
        reset = reset_prefix_cache(target.endpoint, target.api_key, min(60.0, target.timeout_s))
    repeating = config.workload.kind in REPEATING_WORKLOADS
    file_warmup = config.workload.kind == "file" and point.warmup > 0
    return reset, cache_warnings(repeating, earlier, bool(reset), file_warmup)


def run_sessions_cell(
    sweep: Sweep, target: Target, key: str, cell: Cell, seed: int, count, repeat: int
) -> tuple[PointResult, dict[int, int]]:
    """A multi-turn run: about --num-requests turns' worth of sessions (at least as many as run at
    once), warmed up with single prompts of a first turn's length; its result and each session's turns."""
    config, tokenizer = sweep.config, sweep.tokenizer
    turn_len, output_len, point = cell
    width = point.sessions or 1
    wanted = max(width, math.ceil(config.load.num_requests / config.workload.turns))
    conversations = enough(
        make_conversations(config.workload, tokenizer, turn_len, output_len, seed, wanted),
        config.load.num_requests,
        width,
    )
    warm = None
    if point.warmup:
        warm = random_prompts(
            tokenizer, point.warmup, config.workload.system_len + turn_len, output_len, seed + 5
        )
    planned = sum(len(c.turns) for c in conversations)
    progress = None
    if sweep.on_point_start:
        progress = sweep.on_point_start(key, dataclasses.replace(point, num_requests=planned))
    first = repeat * len(conversations)  # each run's sessions numbered apart
    meter = machine_meter(target)
    result = asyncio.run(
        run_sessions(
            target, conversations, point, sweep.records_out, key, progress, count, warm, first, meter
        )
    )
    return result, {first + i: len(c.turns) for i, c in enumerate(conversations)}


def enough(conversations: list[Conversation], num_requests: int, width: int) -> list[Conversation]:
    """The first conversations that hold `num_requests` turns, and at least `width` of them (fewer
    when there are fewer)."""
    out, turns = [], 0
    for conv in conversations:
        if turns >= num_requests and len(out) >= width:
            break
        out.append(conv)
        turns += len(conv.turns)
    return out
