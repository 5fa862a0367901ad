"""The client's self-check: event-loop lag and CPU per point, the client-limited flag, its place in the
summaries (JSON and CSV) and the warning `llmopt bench` prints for it."""

from __future__ import annotations

import asyncio
import csv
import io
import time

import pytest
from rich.console import Console

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point
from llmopt.bench.load.self_check import ClientLoad, SelfCheck, client_summary
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.cli.bench_run import print_point_notes
from tests.bench.conftest import stall


async def blocked_loop(seconds: float, spin: bool) -> ClientLoad:
    """A loop that runs callbacks 30 ms long without a break (busy or asleep) for `seconds`."""
    check = SelfCheck().start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        stop = time.perf_counter() + 0.03
        if spin:
            while time.perf_counter() < stop:
                pass
        else:
            time.sleep(0.03)
        await asyncio.sleep(0)
    return check.stop()


@pytest.mark.slow
def test_a_blocked_loop_is_client_limited_and_says_why():
    load = asyncio.run(blocked_loop(0.4, spin=True))
    assert load.wall_s >= 0.4 and load.lag_s and max(load.lag_s) > 0.015
    summary = client_summary([load])
    assert summary["limited"] and summary["loop_lag_ms"]["p99"] > 10 and summary["loop_lag_ms"]["max"] > 15
    assert any("late" in reason for reason in summary["limited_by"])
    asleep = client_summary([asyncio.run(blocked_loop(0.3, spin=False))])
    assert asleep["limited"] and asleep["cpu"] < 0.5  # late, but not from the client's own work
    assert "the machine is busy" in asleep["limited_by"][0]


def test_a_loop_blocked_to_the_end_of_its_point_counts_as_late():
    async def short_point() -> ClientLoad:
        check = SelfCheck().start()
        await asyncio.sleep(0)  # the watcher starts its first sleep
        time.sleep(0.05)  # ... and never wakes before the point ends
        return check.stop()

    load = asyncio.run(short_point())
    assert len(load.lag_s) == 1 and load.lag_s[0] > 0.03


def test_the_thresholds():
    idle = ClientLoad(lag_s=[0.0005] * 100, cpu_s=0.2, wall_s=1.0)
    assert not client_summary([idle])["limited"]
    late = ClientLoad(lag_s=[0.0005] * 90 + [0.02] * 10, cpu_s=0.2, wall_s=1.0)
    assert client_summary([late])["limited"]
    busy = ClientLoad(lag_s=[0.0005] * 100, cpu_s=0.95, wall_s=1.0)
    both = client_summary([idle, busy], workers=2)  # the busiest process decides
    assert both["limited"] and both["cpu"] == 0.95 and both["workers"] == 2
    assert both["cpu_per_process"] == [0.2, 0.95] and "95%" in both["limited_by"][0]


def test_every_point_measures_its_client(openai_endpoint):
    openai_endpoint.replies.extend(stall(gap_s=0.02, chunks=2, then_stop=False) for _ in range(6))
    target = Target(openai_endpoint.url, "scripted", api="completions")
    work = [BenchRequest(prompt=f"p {i}", max_tokens=4) for i in range(6)]
    result = asyncio.run(run_point(target, work, LoadPoint(concurrency=2, num_requests=6)))
    [load] = result.client
    assert abs(load.wall_s - result.wall_s) < 0.05 and 0 <= load.cpu <= 1.5
    assert len(load.lag_s) >= 1 and all(lag >= 0 for lag in load.lag_s)


def test_the_summaries_carry_the_self_check(openai_endpoint, tokenizer_dir, tmp_path):
    # Answers that take 40 ms: the watcher wakes every 10 ms, so a point of instant answers may end first.
    openai_endpoint.replies.extend(stall(gap_s=0.02, chunks=2, then_stop=False) for _ in range(4))
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        api="completions",
        prompt_lens=[8],
        output_lens=[2],
        concurrencies=[2],
        num_requests=4,
        warmup=0,
    )
    [point] = run_sweep(config, tmp_path / "run", False, load_tokenizer(tokenizer_dir))
    assert point.client.workers == 1 and point.client_limited is point.client.limited
    assert point.client.cpu is not None and point.client.loop_lag_ms["p99"] is not None
    [row] = list(csv.DictReader(io.StringIO(RunDir(tmp_path / "run").summary_csv.read_text())))
    assert row["client_workers"] == "1" and float(row["client_cpu"]) == point.client.cpu
    assert row["client_limited"] == str(point.client_limited)


def test_the_cli_warns_of_a_client_limited_point():
    out = io.StringIO()
    console = Console(file=out, width=300)
    point = {"key": "endpoint|prompt=8|output=2|concurrency=64", "failed": 0}
    block = client_summary([ClientLoad(lag_s=[0.05] * 10, cpu_s=0.97, wall_s=1.0)])
    print_point_notes(console, PointSummary.from_json({**point, "client": block, "client_limited": True}))
    text = out.getvalue()
    assert "concurrency=64: warning: client-limited" in text and "97%" in text and "--workers" in text
    out.truncate(0)
    quiet = client_summary([ClientLoad([0.0001], 0.1, 1.0)])
    print_point_notes(console, PointSummary.from_json({**point, "client": quiet}))
    assert "client-limited" not in out.getvalue()
