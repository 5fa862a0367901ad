"""The goodput search: doubling then bisection on its own, and end to end against a stub whose latency
rises past a known load (four slots: a fifth request in flight waits for one)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.goodput_search import GoodputSearch
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.report.html import write_report
from tests.bench.conftest import content, event_stream


def probes(search: GoodputSearch, meets) -> list[float]:
    """The loads `search` probes when a load meets the SLOs exactly when `meets(load)`."""
    history: list[tuple[float, bool]] = []
    while (load := search.next_load(history)) is not None:
        history.append((load, meets(load)))
    return [load for load, _ in history]


def test_an_integer_search_doubles_then_bisects_to_neighbours():
    search = GoodputSearch({"ttft": 0.1}, start=1, integer=True)
    assert probes(search, lambda c: c <= 4) == [1, 2, 4, 8, 6, 5]
    assert search.answer([(1, True), (2, True), (4, True), (8, False), (6, False), (5, False)]) == 4


def test_a_rate_search_stops_within_its_tolerance():
    search = GoodputSearch({"ttft": 0.1}, start=1.0, integer=False, tolerance=0.1)
    assert probes(search, lambda r: r <= 3.3) == [1.0, 2.0, 4.0, 3.0, 3.5, 3.25]


def test_a_search_whose_first_probe_misses_halves_down():
    search = GoodputSearch({"ttft": 0.1}, start=8, integer=True)
    assert probes(search, lambda c: c <= 2) == [8, 4, 2, 3]
    assert probes(search, lambda c: False) == [8, 4, 2, 1]
    assert search.answer([(1, False)]) is None


def test_a_probe_meets_the_slos_at_the_percentile_and_without_failures():
    search = GoodputSearch({"ttft": 0.1, "tpot": 0.02}, start=1, integer=True, percentile=90)
    ok = PointSummary(failed=0, successful=5, ttft_ms={"p90": 99.0}, tpot_ms={"p90": 20.0})
    assert search.meets(ok)
    assert not search.meets(dataclasses.replace(ok, ttft_ms={"p90": 101.0}))
    assert not search.meets(dataclasses.replace(ok, failed=1))
    assert not search.meets(dataclasses.replace(ok, tpot_ms={"p90": None}))


class Slots:
    """A server with `slots` places: a request waits for one (its first token with it), keeps it for
    `service_s`, and gives it back before its stream ends, so the client's next request finds it free."""

    def __init__(self, slots: int = 4, service_s: float = 0.1):
        self.free = threading.Semaphore(slots)
        self.service_s = service_s

    def __call__(self, handler, request: dict) -> None:
        self.free.acquire()
        try:
            event_stream(handler)
            handler.wfile.write(b"data: " + content("word ") + b"\n\n")
            time.sleep(self.service_s)
            handler.wfile.write(b"data: " + content("word ") + b"\n\n")
        finally:
            self.free.release()
        handler.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def search_config(endpoint: str) -> BenchConfig:
    return BenchConfig.from_settings(
        endpoint=endpoint,
        prompt_lens=[8],
        output_lens=[2],
        concurrencies=[1],
        num_requests=20,
        warmup=0,
        goodput_search="ttft=50ms",
    )


@pytest.mark.slow
def test_the_search_finds_the_load_where_latency_rises(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.replies.extend([Slots()] * 400)
    points = run_sweep(search_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    loads = [p.load for p in points]
    assert loads == [f"concurrency={c}" for c in (1, 2, 4, 8, 6, 5)]  # every probe is a point of the run
    assert [p.search.meets_slo for p in points] == [True, True, True, False, False, False]
    assert [p.search.answer for p in points] == [False, False, True, False, False, False]
    run = RunDir(tmp_path / "r")
    [found] = run.read_summary().settings.search
    assert found.answer == 4 and found.answer_key == "endpoint|prompt=8|output=2|concurrency=4"
    assert len(found.probes) == 6 and run.read_summary().points[2].search.answer is True
    html = write_report([run.path], tmp_path / "report.html").read_text()
    answer = "endpoint|prompt=8|output=2|concurrency=4 (6 probes)"
    assert f"highest load meeting ttft=50ms at p90: {answer}" in html

    sent = len(openai_endpoint.seen)
    again = run_sweep(search_config(openai_endpoint.url), tmp_path / "r", True, tokenizer)
    assert len(openai_endpoint.seen) == sent  # a finished search, resumed, replays its probes
    assert [p.load for p in again] == loads and run.read_summary().settings.search[0].answer == 4


def test_a_search_needs_one_starting_point_and_slos():
    config = search_config("http://127.0.0.1:1/v1")
    config.load.concurrencies = [1, 2]
    with pytest.raises(BenchError, match="starts from one load point"):
        config.validate()
    with pytest.raises(BenchError, match="--goodput-search: bad SLO"):
        BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", goodput_search="speed=fast").validate()
