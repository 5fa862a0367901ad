"""Traffic shapes and client habits: gamma arrivals with a burstiness factor, a linear ramp-up, prompt
lengths with a spread, and streaming on or off as a sweep axis."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.arrivals import arrival_times, ramped
from llmopt.bench.load.client import BenchRequest, Target, send
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.loops import client_session
from llmopt.bench.load.runner import run_point
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.bench.workload import count_tokens, random_prompts
from llmopt.checkpoints import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_keep_the_rate_and_spread_as_the_burstiness_says(burstiness):
    g = gaps(arrival_times(4001, rate=10.0, burstiness=burstiness, seed=1))
    assert statistics.mean(g) == pytest.approx(0.1, rel=0.1)
    # A gamma of shape b has a coefficient of variation of 1 / sqrt(b): 2 bursty, 1 Poisson, 0.5 steady.
    assert statistics.stdev(g) / statistics.mean(g) == pytest.approx(burstiness**-0.5, rel=0.15)


def test_burstiness_one_is_the_poisson_process_of_earlier_runs():
    import random

    rng = random.Random(3)
    expected = [0.0]
    for _ in range(4):
        expected.append(expected[-1] + rng.expovariate(5.0))
    assert arrival_times(5, 5.0, seed=3) == expected


def test_a_ramp_up_rises_linearly_then_holds_the_rate():
    times = arrival_times(41, rate=10.0, arrival="constant", ramp_up_s=2.0)
    # Under a rate rising as 10 t / 2, n arrivals take until sqrt(2 * 2 * n / 10) s; then 10 per second.
    assert times[:11] == pytest.approx([(0.4 * n) ** 0.5 for n in range(11)])
    assert gaps(times[11:]) == pytest.approx([0.1] * 29)
    assert sum(t < 1.0 for t in times) == 3  # 10 * 1^2 / (2 * 2) = 2.5 arrivals in the first second
    assert ramped(5.0, 0.0) == 5.0


@pytest.mark.slow
def test_a_ramp_up_delays_an_open_loops_first_sends(openai_endpoint):
    target = Target(openai_endpoint.url, "scripted", api="completions")
    point = LoadPoint(request_rate=20, arrival="constant", ramp_up_s=1.0, num_requests=12)
    requests = [BenchRequest(prompt=f"p {i}", max_tokens=1) for i in range(12)]
    result = asyncio.run(run_point(target, requests, point))
    starts = sorted(r.start for r in result.records)
    # At 20/s rising over 1 s: the n-th send at sqrt(n / 10) s during the ramp (n < 10), then n / 20 + 0.5.
    expected = [(n / 10) ** 0.5 if n < 10 else n / 20 + 0.5 for n in range(12)]
    assert all(abs(s - e) < 0.04 for s, e in zip(starts, expected)), (starts, expected)
    assert point.label == "rate=20/s,ramp-up=1s"


def test_labels_name_only_what_differs_from_the_defaults():
    assert LoadPoint(request_rate=2).label == "rate=2/s"
    assert LoadPoint(request_rate=2, burstiness=0.5).label == "rate=2/s,burstiness=0.5"
    assert LoadPoint(concurrency=4, stream=False).label == "concurrency=4,no-stream"
    assert LoadPoint(sessions=3).label == "sessions=3"


def test_a_prompt_length_spread_draws_lengths_around_the_asked_one(tokenizer):
    spread = random_prompts(tokenizer, 40, 20, 4, seed=2, spread=0.5)
    lengths = [r.prompt_tokens for r in spread]
    assert all(10 <= n <= 30 for n in lengths) and len(set(lengths)) > 5
    assert all(count_tokens(tokenizer, r.prompt) == r.prompt_tokens for r in spread)
    assert {r.prompt_tokens for r in random_prompts(tokenizer, 10, 20, 4, seed=2)} == {20}


def test_a_non_streamed_answer_is_timed_whole(openai_endpoint):
    async def one():
        target = Target(openai_endpoint.url, "scripted", stream=False)
        async with client_session(target) as session:
            return await send(session, target, BenchRequest(prompt="hi", max_tokens=5), 0, 0.0)

    record = asyncio.run(one())
    [(_, body)] = openai_endpoint.seen
    assert body["stream"] is False and "stream_options" not in body
    assert record.success and record.output_tokens == 5 and record.itl == [] and record.tokens_from == "usage"
    assert record.ttft == pytest.approx(record.e2e, abs=0.005) and record.text == "word " * 5


def test_streaming_on_and_off_is_a_sweep_axis(openai_endpoint, tokenizer, tmp_path):
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        prompt_lens=[8],
        output_lens=[3],
        concurrencies=[1],
        num_requests=2,
        warmup=0,
        streams=[True, False],
    )
    points = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert [(p.load, p.stream, p.successful) for p in points] == [
        ("concurrency=1", True, 2),
        ("concurrency=1,no-stream", False, 2),
    ]
    assert [body["stream"] for _, body in openai_endpoint.seen] == [True, True, False, False]
    assert points[0].itl_ms["median"] is not None and points[1].itl_ms["median"] is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"burstiness": 0.0}, "--burstiness must be positive"),
        ({"burstiness": 2.0, "arrival": "constant"}, "needs --arrival poisson"),
        ({"ramp_up": -1.0}, "--ramp-up"),
        ({"prompt_len_spread": 1.0}, "--prompt-len-spread"),
        ({"streams": []}, "stream is true, false"),
    ],
)
def test_bad_traffic_settings_are_refused(settings, message):
    with pytest.raises(BenchError, match=message):
        BenchConfig.from_settings(
            endpoint="http://127.0.0.1:1/v1", request_rates=[1.0], **settings
        ).validate()
