"""The stepping thread with a stand-in engine: a failed step ends every request and the thread reports
itself unhealthy; nothing queued around a shutdown is left without its final output."""

from __future__ import annotations

import threading
import time

import pytest

from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.outputs import RequestOutput
from llmopt.engine.sampling_params import SamplingParams


class FakeEngine:
    """Queues requests; each step finishes them (or raises, once told to); abort_all ends the rest."""

    def __init__(self, fail: bool = False, fail_warm_up: bool = False):
        self.fail = fail
        self.fail_warm_up = fail_warm_up
        self.pending: dict[str, object] = {}
        self.lock = threading.Lock()

    def add_request(self, prompt, params, request_id, on_output) -> None:
        with self.lock:
            self.pending[request_id] = on_output

    def abort_request(self, request_id: str) -> None:
        pass

    def warm_up(self) -> None:
        if self.fail_warm_up:
            raise RuntimeError("no memory for the KV cache")

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> None:
        if self.fail:
            raise RuntimeError("a broken kernel")
        time.sleep(0.001)

    def abort_all(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, {}
        for request_id, on_output in pending.items():
            on_output(RequestOutput(request_id, [], "", True, "abort"))


def test_a_failed_step_makes_the_thread_unhealthy_and_refuses_new_requests():
    engine = FakeEngine(fail=True)
    thread = EngineThread(engine)
    thread.start()
    outputs: list[RequestOutput] = []
    assert thread.healthy
    thread.add_request([1], SamplingParams(), "a", outputs.append)
    deadline = time.monotonic() + 5
    while thread.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread.healthy and "a broken kernel" in thread.failure
    time.sleep(0.1)
    assert [o.finish_reason for o in outputs] == ["abort"]  # the running request got its end
    with pytest.raises(RuntimeError, match="engine failed"):
        thread.add_request([1], SamplingParams(), "b", outputs.append)


def test_every_request_queued_around_shutdown_gets_its_final_output():
    engine = FakeEngine()
    thread = EngineThread(engine)
    thread.start()
    finished: set[str] = set()
    added: list[str] = []

    def add_until_refused() -> None:
        for i in range(100_000):
            try:
                thread.add_request([1], SamplingParams(), f"r{i}", lambda o: finished.add(o.request_id))
            except RuntimeError:
                return
            added.append(f"r{i}")

    adder = threading.Thread(target=add_until_refused)
    adder.start()
    time.sleep(0.05)
    thread.shutdown()
    adder.join()
    assert added and set(added) == finished


def test_a_failed_warm_up_makes_the_thread_unhealthy_and_refuses_requests():
    thread = EngineThread(FakeEngine(fail_warm_up=True))
    thread.start()  # returns: the failure is reported, not raised into the server's start-up
    assert not thread.healthy and "no memory for the KV cache" in thread.failure
    with pytest.raises(RuntimeError, match="engine failed"):
        thread.add_request([1], SamplingParams(), "a", lambda output: None)
    thread.shutdown()
