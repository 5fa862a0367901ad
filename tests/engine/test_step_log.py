"""The engine's step log: what each step computed and cost, each request's queue time and cache hit."""

from __future__ import annotations

import json
import logging

from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.step_log import RequestTrace, StepLog, StepRecord
from tests.conftest import PROMPTS


def record(**changes) -> StepRecord:
    fields = dict(
        start=10.0,
        duration_s=0.02,
        cpu_s=0.019,
        idle_before_s=0.001,
        schedule_s=0.0001,
        forward_s=0.018,
        prefill_tokens=100,
        prefill_seqs=1,
        decode_rows=3,
        generated_tokens=4,
        num_running=4,
        num_waiting=0,
    )
    return StepRecord(**{**fields, **changes})


def trace(**changes) -> RequestTrace:
    fields = dict(
        request_id="r",
        prompt_tokens=120,
        cached_tokens=96,
        output_tokens=8,
        queue_s=0.01,
        ttft_s=0.05,
        e2e_s=0.2,
        finish_reason="length",
    )
    return RequestTrace(**{**fields, **changes})


def test_records_reach_the_observers_and_the_trace_file(tmp_path):
    path = tmp_path / "steps.jsonl"
    log = StepLog(trace_path=str(path))
    steps, requests = [], []
    log.step_observers.append(steps.append)
    log.request_observers.append(requests.append)
    log.step(record())
    log.request(trace())
    assert steps == [record()] and requests == [trace()]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.pop("kind") for line in lines] == ["step", "request"]
    assert StepRecord(**lines[0]) == record() and RequestTrace(**lines[1]) == trace()
    assert log.idle_since_last_step(10.5) == 10.5 - 10.02


def test_the_interval_line_sums_throughput_and_the_cache_hit_rate(caplog):
    log = StepLog(interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="llmopt.engine.step_log"):
        log.interval.start = 9.0
        log.request(trace())
        log.step(record(start=9.98))  # ends at 10.0: one second since the interval began
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "100.0 prompt tok/s" in line and "4.0 generation tok/s" in line
    assert "prefix cache hit rate 80.0 %" in line and "busy 2 %" in line


def test_the_engine_logs_every_step_and_request(llm):
    engine = llm.engine
    steps, requests = [], []
    engine.step_log.step_observers.append(steps.append)
    engine.step_log.request_observers.append(requests.append)
    try:
        ids = [llm.tokenizer.encode(p) for p in PROMPTS[:2]]
        params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        llm.generate(ids, params)
    finally:
        engine.step_log.step_observers.remove(steps.append)
        engine.step_log.request_observers.remove(requests.append)
    first, *decodes = steps
    assert (first.prefill_tokens, first.prefill_seqs, first.decode_rows) == (sum(map(len, ids)), 2, 0)
    assert first.generated_tokens == 2 and first.forward_s <= first.duration_s
    assert [(s.prefill_tokens, s.decode_rows, s.generated_tokens) for s in decodes] == [(0, 2, 2)] * 2
    assert sorted(r.prompt_tokens for r in requests) == sorted(map(len, ids))
    assert all(r.output_tokens == 3 and 0 <= r.queue_s <= r.ttft_s <= r.e2e_s for r in requests)
