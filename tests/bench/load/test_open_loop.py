"""Open-loop load points against the scripted endpoint: arrivals at a constant or Poisson rate, the
concurrency cap, the time limit, and warm-up prompts that no measured request shares."""

from __future__ import annotations

import asyncio

import pytest

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.loops import client_session
from llmopt.bench.load.runner import run_point
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from tests.bench.conftest import answer, stall


def requests(n: int, max_tokens: int = 2) -> list[BenchRequest]:
    return [BenchRequest(prompt=f"prompt {i}", max_tokens=max_tokens) for i in range(n)]


def run(endpoint, point: LoadPoint, n: int):
    target = Target(endpoint.url, "scripted", api="completions")
    return asyncio.run(run_point(target, requests(n), point))


def test_constant_arrivals_are_evenly_spaced(openai_endpoint):
    result = run(openai_endpoint, LoadPoint(request_rate=20, arrival="constant", num_requests=10), 10)
    starts = sorted(r.start for r in result.records)
    assert len(starts) == 10 and all(r.success for r in result.records)
    for i, start in enumerate(starts):
        assert abs(start - i / 20) < 0.05, (i, start)  # a send is due every 50 ms


@pytest.mark.slow
def test_poisson_arrivals_are_not_evenly_spaced(openai_endpoint):
    result = run(openai_endpoint, LoadPoint(request_rate=40, arrival="poisson", num_requests=40, seed=3), 40)
    starts = sorted(r.start for r in result.records)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) > 2 * min(gaps) + 0.01  # exponential gaps spread out; constant ones would not
    assert 0.5 < starts[-1] / (39 / 40) < 2.0  # ... around the asked rate


@pytest.mark.slow
def test_the_concurrency_cap_holds_for_an_open_loop(openai_endpoint):
    openai_endpoint.replies.extend(stall(gap_s=0.2, chunks=1, then_stop=False) for _ in range(8))
    point = LoadPoint(request_rate=200, arrival="constant", max_concurrency=2, num_requests=8)
    result = run(openai_endpoint, point, 8)
    spans = [(r.start, r.start + r.e2e) for r in result.records if r.success]
    assert len(spans) == 8
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2


def test_max_seconds_stops_sending(openai_endpoint):
    point = LoadPoint(request_rate=10, arrival="constant", num_requests=100, max_seconds=0.45)
    result = run(openai_endpoint, point, 100)
    assert 4 <= len(result.records) <= 6 and result.wall_s < 2


@pytest.mark.slow
def test_no_measured_request_shares_a_prompt_with_the_warm_up(openai_endpoint, tokenizer_dir, tmp_path):
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        api="completions",
        prompt_lens=[16],
        output_lens=[2],
        concurrencies=[1, 2],
        num_requests=3,
        warmup=2,
    )
    run_sweep(config, tmp_path / "run", False, load_tokenizer(tokenizer_dir))
    prompts = [body["prompt"] for _, body in openai_endpoint.seen]
    assert len(prompts) == 2 * (2 + 3)
    assert len(set(prompts)) == len(prompts), "a prompt was sent twice: a prefix cache could serve it"


def test_without_connection_reuse_no_connection_is_kept_alive():
    async def force_close(reuse: bool) -> bool:
        async with client_session(Target("http://127.0.0.1:1/v1", "m", connection_reuse=reuse)) as session:
            return session.connector.force_close

    assert asyncio.run(force_close(False)) and not asyncio.run(force_close(True))


def test_arrivals_waiting_for_a_place_are_not_sent_once_the_point_stops(openai_endpoint):
    # 40 arrivals due at once behind a cap of 1: once 10 have failed the point stops, and those still
    # waiting for the place are dropped, not sent to a server the point has given up on.
    openai_endpoint.replies.extend(answer(500, '{"error": "boom"}') for _ in range(40))
    point = LoadPoint(
        request_rate=10_000, arrival="constant", max_concurrency=1, num_requests=40, max_error_rate=0.0
    )
    result = run(openai_endpoint, point, 40)
    assert result.stopped_early and "error rate" in result.stopped_early
    assert len(openai_endpoint.seen) == len(result.records) <= 11
