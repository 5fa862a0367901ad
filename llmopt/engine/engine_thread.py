"""The engine's stepping thread, so that a server's event loop stays free while the model runs."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.outputs import RequestOutput
from llmopt.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineThread:
    """Runs `LLMEngine.step()` on a thread of its own, so that a server's event loop stays free.

    Requests and aborts may come from any thread; outputs go to each request's callback from the
    engine thread (an asyncio server hands them over with `loop.call_soon_threadsafe`).
    """

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._wakeup = threading.Event()
        self._stopping = False
        # Held while a request is checked and queued, and while stopping is set: no request can be queued
        # after the final abort_all (it would never get an output, and its client would wait forever).
        self._intake = threading.Lock()
        self.failure: str | None = None  # why a step failed: the engine then serves nothing more
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llmopt-engine", daemon=True)
        self._warm = threading.Event()

    def begin(self) -> None:
        """Start the thread, which warms the engine up and then steps; returns at once (once per thread:
        a later call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def start(self) -> None:
        """Start stepping (begin) and return once the engine has warmed up on its thread (a server accepts
        requests only after that, so the first one does not pay for it)."""
        self.begin()
        self._warm.wait()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        on_output: Callable[[RequestOutput], None],
    ) -> None:
        with self._intake:
            if self.failure is not None:
                raise RuntimeError(f"the engine failed and serves no more requests ({self.failure})")
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self.engine.add_request(prompt, params, request_id, on_output)
        self._wakeup.set()

    def call(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the engine thread between two steps (the engine's state is only touched there)."""
        future: Future = Future()
        self._calls.put((fn, future))
        self._wakeup.set()
        return future

    def _run_calls(self) -> None:
        while not self._calls.empty():
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except Exception as exc:  # the caller's to handle, not the engine's
                future.set_exception(exc)

    def abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def healthy(self) -> bool:
        """The thread is stepping (or waiting for work) and no step has failed."""
        return self.failure is None and self._thread.is_alive() and not self._stopping

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop stepping; every unfinished request gets its final output with finish_reason 'abort'."""
        with self._intake:
            self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        engine = self.engine
        try:
            engine.warm_up()
        except Exception as exc:  # a forward that fails on dummy tokens would fail on a request's too
            log.exception("engine warm-up failed; /health reports the failure")
            with self._intake:
                self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._warm.set()
        while not self._stopping and self.failure is None:
            self._run_calls()
            if not engine.has_unfinished_requests():
                self._wakeup.wait(0.05)
                self._wakeup.clear()
                continue
            try:
                engine.step()
            except Exception as exc:  # the step itself failed: its state is unknown, so serve no more
                log.exception("engine step failed; every request ends and /health reports the failure")
                with self._intake:
                    self.failure = f"{type(exc).__name__}: {exc}"
                break
        engine.abort_all()
        self._run_calls()  # what was asked before the end still gets its answer
        try:
            engine.close()  # the prefix cache's blocks to the disk tier, for the next start
        except Exception:  # a tier that cannot be written is no reason for the stop to fail
            log.exception("the KV disk tier could not be closed")
