"""`--workers N`: a point's load from N client processes, against a stub that counts the requests it
holds at once. The workers' records must add up to exactly the point's requests, on one clock, with the
concurrency (or the arrival schedule) of one process, and summarize as one process's would."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.arrivals import arrival_times
from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point, run_sessions
from llmopt.bench.load.workers import shares, split
from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import RequestRecord
from llmopt.bench.sweep.bench_config import BenchConfig, with_overrides
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.bench.workload.conversation import Conversation, Turn
from llmopt.checkpoints import load_tokenizer
from llmopt.cli.bench import settings_from_options


@dataclass
class Counting:
    """What the stub saw: each prompt it was sent, and the most requests it held at once."""

    url: str = ""
    delay_s: float = 0.05
    status: int = 200
    prompts: list[str] = field(default_factory=list)
    in_flight: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class CountingHandler(http.server.BaseHTTPRequestHandler):
    """Holds every completion `delay_s`, then streams two chunks and the usage."""

    stub: Counting
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        stub = self.stub
        with stub.lock:
            stub.prompts.append(body["prompt"])
            stub.in_flight += 1
            stub.most = max(stub.most, stub.in_flight)
        try:
            time.sleep(stub.delay_s)
            if stub.status != 200:
                self.send_response(stub.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            chunks = [{"choices": [{"index": 0, "text": "word "}]} for _ in range(2)]
            chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
            data = (
                b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            with stub.lock:
                stub.in_flight -= 1

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def counting_stub() -> Iterator[Counting]:
    stub = Counting()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (CountingHandler,), {"stub": stub}))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()


def requests(n: int) -> list[BenchRequest]:
    return [BenchRequest(prompt=f"prompt {i}", max_tokens=2, prompt_tokens=3) for i in range(n)]


def run(stub: Counting, point: LoadPoint, n: int):
    return asyncio.run(run_point(Target(stub.url, "stub", api="completions"), requests(n), point))


def test_shares_split_the_load_exactly():
    assert split(5, 2) == [3, 2] and split(4, 4) == [1, 1, 1, 1]
    closed = shares(LoadPoint(concurrency=5, workers=2, warmup=3), 20, requests(3))
    assert [s.point.concurrency for s in closed] == [3, 2]
    assert sorted(r.prompt for s in closed for r in s.point.warmup_requests) == [
        r.prompt for r in requests(3)
    ]
    assert len(shares(LoadPoint(concurrency=2, workers=4), 20, [])) == 2  # no worker without a slot
    opened = shares(LoadPoint(request_rate=10, max_concurrency=3, workers=2), 9, [])
    assert sorted(i for s in opened for i in s.indices) == list(range(9))
    assert [s.point.max_concurrency for s in opened] == [2, 1]


@pytest.mark.slow
def test_workers_send_every_request_once_at_the_points_concurrency(counting_stub):
    result = run(counting_stub, LoadPoint(concurrency=4, num_requests=24, workers=2), 24)
    assert result.workers == 2 and len(result.client) == 2
    assert sorted(r.index for r in result.records) == list(range(24))
    assert sorted(counting_stub.prompts) == sorted(f"prompt {i}" for i in range(24))
    assert all(r.success for r in result.records)
    assert counting_stub.most == 4  # both workers' slots full at once, never more
    # One clock: the records' spans, each worker's own, overlap as the stub saw them (at most 4 at once).
    spans = [(r.start, r.start + r.e2e) for r in result.records]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 4
    assert min(s for s, _ in spans) < 0.05 and result.wall_s >= max(e for _, e in spans)
    assert result.wall_s < 24 / 4 * 0.05 * 3  # six rounds of 50 ms, not one worker doing it all


@pytest.mark.slow
def test_an_open_loop_split_over_workers_keeps_the_schedule(counting_stub):
    counting_stub.delay_s = 0.01
    point = LoadPoint(request_rate=40, arrival="poisson", num_requests=20, seed=5, workers=3)
    result = run(counting_stub, point, 20)
    due = arrival_times(20, 40, "poisson", seed=5)
    assert sorted(r.index for r in result.records) == list(range(20))
    for r in result.records:  # each arrival sent at its own time of the one-process schedule
        assert abs(r.start - due[r.index]) < 0.03, (r.index, r.start, due[r.index])


@pytest.mark.slow
def test_the_error_rate_stop_reaches_every_worker(counting_stub):
    counting_stub.status, counting_stub.delay_s = 500, 0.02
    point = LoadPoint(concurrency=2, num_requests=200, workers=2, max_error_rate=0.5)
    result = run(counting_stub, point, 200)
    assert result.stopped_early and "error rate" in result.stopped_early
    assert 10 <= len(result.records) < 40 and len(counting_stub.prompts) == len(result.records)


@pytest.mark.slow  # each worker unpickles the tokenizer: imports transformers (seconds each)
def test_a_sweep_with_workers_summarizes_the_merged_records_as_one_process(
    counting_stub, tokenizer_dir, tmp_path
):
    config = BenchConfig.from_settings(
        endpoint=counting_stub.url,
        model="stub",
        api="completions",
        concurrencies=[4],
        num_requests=16,
        warmup=2,
        workers=2,
        slo="ttft=1s",
        reset_prefix_cache=False,
    )
    [point] = run_sweep(config, tmp_path / "run", False, load_tokenizer(tokenizer_dir))
    assert point.client.workers == 2 and len(point.client.cpu_per_process) == 2
    records = RunDir(tmp_path / "run").read_records()
    assert len(records) == 16 and len(counting_stub.prompts) == 16 + 2  # the warm-up split, not repeated
    again = summarize(records, point.duration_s, {"ttft": 1.0})
    recorded = point.to_json()
    assert {k: recorded[k] for k in again} == again


def test_workers_come_from_a_recipe_or_the_command_line(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[target]\nendpoint = "http://127.0.0.1:1/v1"\n[load]\nconcurrency = [8]\nworkers = 2\n'
    )
    config = load_recipe(recipe)
    config.validate()
    assert config.load.workers == 2 and [p.workers for p in config.load_points()] == [2]
    overridden = with_overrides(config, settings_from_options({**cli_defaults(), "workers": 4}))
    assert [p.workers for p in overridden.load_points()] == [4]
    with pytest.raises(BenchError, match="--workers must be >= 1"):
        BenchConfig.from_settings(endpoint="http://x/v1", workers=0).validate()


def cli_defaults() -> dict:
    """The options of `llmopt bench` as typer passes them when none is given."""
    import inspect

    from llmopt.cli.bench import bench

    return {name: p.default for name, p in inspect.signature(bench).parameters.items() if name != "ctx"}


def conversations(n: int, turns: int) -> list[Conversation]:
    return [
        Conversation([Turn(f"session {s} turn {k}", max_tokens=3) for k in range(turns)], system="be brief")
        for s in range(n)
    ]


@pytest.mark.slow
def test_sessions_split_over_workers_replay_their_own_history(openai_endpoint):
    target = Target(openai_endpoint.url, "scripted")
    point = LoadPoint(sessions=4, workers=2)
    result = asyncio.run(run_sessions(target, conversations(6, 3), point, first_session=10))
    assert result.workers == 2 and len(result.records) == 18 and all(r.success for r in result.records)
    assert sorted(r.index for r in result.records) == list(range(18))  # one numbering across processes
    by_session: dict[int, list[RequestRecord]] = {}
    for r in sorted(result.records, key=lambda r: r.start):
        by_session.setdefault(r.session, []).append(r)
    assert sorted(by_session) == list(range(10, 16))
    assert all([r.turn for r in rs] == [0, 1, 2] for rs in by_session.values())
    spans = [(rs[0].start, rs[-1].start + rs[-1].e2e) for rs in by_session.values()]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 4  # sessions at once, one clock
    last_turns = [body["messages"] for _, body in openai_endpoint.seen if len(body["messages"]) == 6]
    assert len(last_turns) == 6  # each replayed its own answers, kept in its worker
    for messages in last_turns:
        assert messages[2]["content"] == messages[4]["content"] == "word word word "
        assert len({m["content"][:9] for m in messages if m["role"] == "user"}) == 1  # one session's turns


@pytest.mark.slow
def test_a_session_rate_split_over_workers_keeps_the_schedule(openai_endpoint):
    target = Target(openai_endpoint.url, "scripted")
    point = LoadPoint(session_rate=20, arrival="constant", workers=2)
    result = asyncio.run(run_sessions(target, conversations(6, 2), point))
    firsts = {r.session: r.start for r in result.records if r.turn == 0}
    assert sorted(firsts) == list(range(6)) and len(result.records) == 12
    for number, start in firsts.items():
        assert abs(start - number / 20) < 0.03, (number, start)


def explode() -> None:
    raise RuntimeError("this worker cannot start")


class CannotStart:
    """Pickles in the parent, fails to unpickle in the worker: a worker that dies before it says a word."""

    def __reduce__(self):
        return explode, ()

    def __call__(self, text: str) -> int:
        return 0


@pytest.mark.slow
def test_a_worker_that_dies_is_a_clear_error_not_a_hang(counting_stub):
    target = Target(counting_stub.url, "stub", api="completions")
    point = LoadPoint(concurrency=2, num_requests=4, workers=2)
    started = time.perf_counter()
    with pytest.raises(BenchError, match=r"bench worker .* ended \(exit code 1\)"):
        asyncio.run(run_point(target, requests(4), point, count_tokens=CannotStart()))
    assert time.perf_counter() - started < 30 and counting_stub.prompts == []
