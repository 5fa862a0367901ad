"""A point's steady state: latencies over the requests sent in the middle of its send window, throughput
over the output that arrived in the middle of its arrival window, counts over every request, small points
whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.measure.steady_state import RULE, steady_state
from llmopt.bench.schema import RequestRecord


def record(index: int, start: float, ttft: float, e2e: float | None = None) -> RequestRecord:
    return RequestRecord(
        index=index, start=start, ttft=ttft, e2e=e2e or ttft, prompt_tokens=10, output_tokens=4, success=True
    )


def warm_and_drain(n: int = 40) -> list[RequestRecord]:
    """Sent every second: the first 4 slow (a cold server), the last 4 fast (a draining one)."""
    ttfts = [1.0] * 4 + [0.1] * (n - 8) + [0.05] * 4
    return [record(i, float(i), ttft) for i, ttft in enumerate(ttfts)]


def test_latencies_leave_out_the_warm_up_and_the_drain():
    records = warm_and_drain()
    whole = summarize(records, 40.0)
    steady = summarize(records, 40.0, steady=steady_state([(records, 40.0)]))
    assert whole["ttft_ms"]["p99"] == pytest.approx(1000, rel=0.01)
    # Sent at 0 .. 39 s: those sent before 3.9 s or after 35.1 s are left out, 32 of 40 kept.
    assert steady["ttft_ms"]["p99"] == pytest.approx(100) and steady["ttft_ms"]["mean"] == pytest.approx(100)
    assert steady["steady_state"] == {
        "rule": RULE,
        "applied": True,
        "kept": 32,
        "of": 40,
        "throughput_requests": steady["steady_state"]["throughput_requests"],
        "throughput_span_s": steady["steady_state"]["throughput_span_s"],
    }


def test_throughput_is_the_rate_of_finishes_without_the_drains_tail():
    # Two requests a second, each answered in 1 s, but the last 4 straggle for 10 s: a wall-time rate
    # counts their tail, the steady state the pace the server kept.
    records = [record(i, i * 0.5, 0.2, 10.0 if i >= 36 else 1.0) for i in range(40)]
    wall = max(r.start + r.e2e for r in records)
    assert summarize(records, wall)["request_throughput"] == pytest.approx(40 / wall)
    steady = summarize(records, wall, steady=steady_state([(records, wall)]))
    assert steady["request_throughput"] == pytest.approx(2.0)
    assert steady["output_throughput"] == pytest.approx(8.0)
    assert steady["total_token_throughput"] == pytest.approx(28.0)


def test_a_closed_loop_finishing_in_waves_gets_the_rate_it_was_delivered():
    """One real round (data/closed_loop_16_streams.jsonl: llmopt serve, 32 requests of 128 tokens at 16
    in flight) finishes in waves: the rate between the first and last finish of its finish window's
    middle read 168,522 tok/s, where its wall-time rate is 403 and its 16 streams' ITL allow at most ~575."""
    lines = (
        (Path(__file__).resolve().parents[1] / "data" / "closed_loop_16_streams.jsonl")
        .read_text()
        .splitlines()
    )
    records = [RequestRecord(**json.loads(line)) for line in lines]
    wall = max(r.start + r.e2e for r in records)
    whole = summarize(records, wall)["output_throughput"]
    steady = summarize(records, wall, steady=steady_state([(records, wall)]))
    assert 400 < whole < steady["output_throughput"] < 575
    assert steady["steady_state"]["applied"]


def test_counts_and_token_totals_keep_every_request():
    records = warm_and_drain() + [RequestRecord(index=40, error="HTTP 500: boom", status=500)]
    steady = summarize(records, 40.0, {"ttft": 0.5}, steady=steady_state([(records, 40.0)]))
    assert (steady["requests"], steady["successful"], steady["failed"]) == (41, 40, 1)
    assert (steady["prompt_tokens"], steady["output_tokens"]) == (400, 160)
    assert steady["goodput"] == pytest.approx(36 / 40.0)  # over every request and the wall time


def test_a_point_below_the_threshold_keeps_its_whole_figures():
    records = warm_and_drain(19)
    whole = summarize(records, 19.0)
    steady = summarize(records, 19.0, steady=steady_state([(records, 19.0)]))
    assert steady.pop("steady_state") == {
        "rule": RULE,
        "applied": False,
        "kept": 19,
        "of": 19,
        "throughput_requests": 19,
        "throughput_span_s": 19.0,
    }
    assert steady == whole


def test_runs_are_cut_each_on_its_own_clock_then_pooled():
    # Every run's records count from its own start: pooled, their windows would be one.
    first = [record(i, i * 0.5, 0.2, 1.0) for i in range(30)]
    second = [record(i, i * 0.5, 0.4, 1.0) for i in range(30)] + [record(30, 0.0, 15.4)]
    state = steady_state([(first, 16.0), (second, 16.0)])
    one = steady_state([(first, 16.0)])
    assert state.applied and state.of == 61
    assert len(state.latency) == 2 * len(one.latency)  # the slow one, sent first, is left out
    assert all(r.ttft < 1 for r in state.latency)
    assert sum(share for _, share in state.delivered) / state.span_s == pytest.approx(2.0)


def test_a_run_whose_middle_holds_no_send_counts_whole():
    """24 requests at 16 in flight: the first 16 go at once, the other 8 as the first finish, late in the
    send window; cutting its edges kept none, and every latency read '-'."""
    records = [record(i, 0.0, 0.3, 2.0) for i in range(16)]
    records += [record(16 + i, 2.0 + 0.001 * i, 0.3, 2.0) for i in range(8)]
    steady = summarize(records, 4.0, steady=steady_state([(records, 4.0)]))
    assert steady["ttft_ms"]["median"] == pytest.approx(300)
    assert steady["steady_state"]["applied"] is False and steady["steady_state"]["kept"] == 24
