"""The engine requests behind one HTTP request, and the hand-over of their outputs from the engine
thread to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable

from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.outputs import RequestOutput
from llmopt.engine.sampling_params import SamplingParams
from llmopt.server.metrics import ServerMetrics


class RequestGroup:
    """The engine requests behind one HTTP request (every prompt times n), read from one queue.

    Leaving `outputs()` early (a client that went away, an error) aborts what is still running, so
    its KV blocks go back to the pool.
    """

    def __init__(
        self,
        engine_thread: EngineThread,
        metrics: ServerMetrics,
        prompts: list[list[int]],
        params: list[SamplingParams],
        n_per_prompt: int,
    ):
        self.engine_thread = engine_thread
        self.n_per_prompt = n_per_prompt  # choices i*n .. i*n+n-1 share prompt i
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self.start = time.perf_counter()
        base = uuid.uuid4().hex
        self.request_ids = [f"{base}-{i}" for i in range(len(prompts))]
        self.unfinished = set(range(len(prompts)))
        loop = asyncio.get_running_loop()
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                engine_thread.add_request(prompt, p, self.request_ids[i], self._sink(loop, i))
        except (ValueError, RuntimeError):
            self.abort()
            raise

    def _sink(self, loop: asyncio.AbstractEventLoop, index: int) -> Callable[[RequestOutput], None]:
        def put(output: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, output))

        return put

    def abort(self) -> None:
        for i in self.unfinished:
            self.engine_thread.abort(self.request_ids[i])

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        last_token_time: dict[int, float | None] = {i: None for i in self.unfinished}
        try:
            while self.unfinished:
                index, output = await self.queue.get()
                now = time.perf_counter()
                if output.new_token_ids:
                    previous = last_token_time[index]
                    if previous is None:
                        self.metrics.ttft.observe(now - self.start)
                    else:
                        self.metrics.itl.observe(now - previous)
                    last_token_time[index] = now
                if output.finished:
                    self.unfinished.discard(index)
                    self.metrics.e2e.observe(now - self.start)
                yield index, output
        finally:
            self.abort()
