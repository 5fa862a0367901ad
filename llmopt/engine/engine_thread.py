from __future__ import annotations

import logging
import threading
from collections.abc import Callable

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
        self._thread = threading.Thread(target=self._run, name="llmopt-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        on_output: Callable[[RequestOutput], None],
    ) -> None:
        if self._stopping:
            raise RuntimeError("the engine is shutting down")
        self.engine.add_request(prompt, params, request_id, on_output)
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop stepping; every unfinished request gets its final output with finish_reason 'abort'."""
        self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            if not engine.has_unfinished_requests():
                self._wakeup.wait(0.05)
                self._wakeup.clear()
                continue
            try:
                engine.step()
            except Exception:  # a bug must not leave clients hanging: end every request, keep serving
                log.exception("engine step failed; aborting the running requests")
                engine.abort_all()
        engine.abort_all()
