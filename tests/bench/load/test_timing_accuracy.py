"""The bench's clock against a stub whose timings are known (benchmarks/accuracy_stub.py, in a process of
its own, which records when it really sent each chunk): what the client measures is what the stub did,
within a tolerance wide enough for a busy 2-core machine, and a chunk is timed when its bytes arrive, not
after the client has parsed it."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from llmopt.bench.load import client
from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.loops import client_session
from llmopt.bench.load.runner import run_point
from llmopt.bench.schema import RequestRecord
from llmopt.bench.servers.launcher import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))  # the stub lives there
import accuracy_stub  # noqa: E402

TIMING = accuracy_stub.StubTiming(ttft_ms=50.0, itl_ms=5.0, tokens=16)
TOLERANCE_S = 0.015  # TTFT and E2E medians; a busy machine wakes processes late by milliseconds


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    port = free_port()
    proc = accuracy_stub.start(port, TIMING)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.join(10)


def stub_call(url: str, method: str = "GET") -> list:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def measure(stub: str, concurrency: int, requests: int) -> tuple[list[RequestRecord], list[dict]]:
    """The bench's records of one closed-loop point against the stub, and the stub's truth of it."""
    stub_call(stub + "/stub/reset", "POST")
    target = Target(stub + "/v1", "stub")
    work = [BenchRequest(prompt="hi", max_tokens=TIMING.tokens, prompt_tokens=1)]
    point = LoadPoint(concurrency=concurrency, num_requests=requests)
    result = asyncio.run(run_point(target, work, point))
    assert all(r.success for r in result.records), [r.error for r in result.records]
    return result.records, stub_call(stub + "/stub/timings")


def test_a_stub_with_known_delays_is_measured_within_tolerance(stub):
    records, truth = measure(stub, concurrency=4, requests=16)
    assert len(records) == len(truth) == 16
    ttft = statistics.median(r.ttft for r in records)
    true_ttft = statistics.median(t["ttft"] for t in truth)
    # The stub keeps its schedule (it is the reference): first token at 50 ms, give or take a late wake-up.
    assert TIMING.ttft_ms / 1000 <= true_ttft < TIMING.ttft_ms / 1000 + TOLERANCE_S
    # No client sees a token before it was sent; and not much later either.
    assert true_ttft - 0.0005 <= ttft < true_ttft + TOLERANCE_S
    gaps = statistics.median(g for r in records for g in r.itl)
    true_gaps = statistics.median(g for t in truth for g in t["itl"])
    assert abs(gaps - true_gaps) < 0.003
    assert all(len(r.itl) == TIMING.tokens - 1 for r in records)
    e2e = statistics.median(r.e2e for r in records)
    true_e2e = statistics.median(t["e2e"] for t in truth)
    assert true_e2e - 0.0005 <= e2e < true_e2e + TOLERANCE_S


def test_a_chunk_is_timed_when_it_arrives_not_after_it_is_parsed(stub, monkeypatch):
    """Parsing the first content chunk takes 40 ms here: the TTFT must not count it."""
    parse = client.parse_chunk
    slowed: list[bool] = []

    def slow_parse(data: bytes):
        if not slowed:
            slowed.append(True)
            time.sleep(0.04)
        return parse(data)

    monkeypatch.setattr(client, "parse_chunk", slow_parse)
    records, truth = measure(stub, concurrency=1, requests=1)
    assert slowed
    assert records[0].ttft < truth[0]["ttft"] + 0.02


def test_a_request_is_timed_from_when_it_went_out_not_from_the_call(stub):
    """aiohttp writes a request's body in a task of its own: a loop busy with other streams runs it late
    (here blocked 60 ms between the call and the write), and that wait is the client's, not the server's."""
    stub_call(stub + "/stub/reset", "POST")
    target = Target(stub + "/v1", "stub")
    request = BenchRequest(prompt="hi", max_tokens=TIMING.tokens, prompt_tokens=1)

    async def busy_second_send() -> RequestRecord:
        async with client_session(target) as session:
            await client.send(session, target, request, 0, time.perf_counter())  # a pooled connection
            asyncio.get_running_loop().call_soon(time.sleep, 0.06)  # runs before the body's task
            return await client.send(session, target, request, 1, time.perf_counter())

    record = asyncio.run(busy_second_send())
    truth = stub_call(stub + "/stub/timings")[-1]
    assert record.success and truth["ttft"] - 0.0005 <= record.ttft < truth["ttft"] + 0.03


def test_a_chunk_is_timed_when_the_loop_received_it_not_when_its_reader_woke(stub, monkeypatch):
    """Between the event loop receiving a chunk and the reading coroutine's turn, other streams' work
    runs (here 40 ms of it, once): the TTFT must not count it."""
    readany = aiohttp.StreamReader.readany
    delayed: list[bool] = []

    async def late_readany(self) -> bytes:
        data = await readany(self)
        if data and not delayed:
            delayed.append(True)
            time.sleep(0.04)
        return data

    monkeypatch.setattr(aiohttp.StreamReader, "readany", late_readany)
    records, truth = measure(stub, concurrency=1, requests=1)
    assert delayed
    assert truth[0]["ttft"] - 0.0005 <= records[0].ttft < truth[0]["ttft"] + 0.02
