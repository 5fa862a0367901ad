"""A streaming OpenAI-compatible stub whose timings are known, for measuring how accurately a client times.

It answers every completion request (chat or text) with `tokens` one-word chunks: the first `ttft_ms`
after the request arrived, then one every `itl_ms`, then the usage and `data: [DONE]`. Deadlines are
absolute (arrival + T + k I), so a late wake-up delays one chunk and not every chunk after it. Asyncio
still wakes up to a millisecond late and a busy machine later still, so the stub records when it really
sent each chunk (`time.perf_counter()` right after the bytes went to the socket) and serves the record
at GET /stub/timings; POST /stub/reset empties it. Those recorded times, not T and I, are the truth a
client's measurements are compared with.

Raw HTTP/1.1 on an asyncio Protocol (keep-alive, chunked transfer encoding) rather than a web framework:
a request's arrival is stamped when the loop reads it, and each chunk is a timer callback, so the stub's
own work per chunk is small and it keeps up with 64 streams. It runs in a process of its own (`start`).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field


@dataclass
class StubTiming:
    """The stub's schedule: first token after `ttft_ms`, then one every `itl_ms`; `tokens` per answer."""

    ttft_ms: float = 50.0
    itl_ms: float = 5.0
    tokens: int = 64


@dataclass
class Served:
    """What the stub did for one request (perf_counter seconds, the clock every process shares here)."""

    received: float
    sends: list[float] = field(default_factory=list)  # each content chunk, after its bytes were written
    end: float = 0.0  # after the usage, [DONE] and the last HTTP chunk were written

    def truth(self) -> dict:
        """The request's true TTFT, inter-token gaps and E2E, in seconds, and when it arrived."""
        gaps = [b - a for a, b in zip(self.sends, self.sends[1:])]
        ttft, e2e = self.sends[0] - self.received, self.end - self.received
        return {"received": self.received, "ttft": ttft, "itl": gaps, "e2e": e2e}


def http_response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def token_event(chat: bool) -> bytes:
    choice = {"index": 0, "delta": {"content": "word "}} if chat else {"index": 0, "text": "word "}
    return b"data: " + json.dumps({"id": "stub", "choices": [choice]}).encode() + b"\n\n"


class TimedStub:
    """The shared state: the schedule, the record of what was served, the prebuilt chunks."""

    def __init__(self, timing: StubTiming):
        self.timing = timing
        self.served: list[Served] = []
        self.events = {chat: http_chunk(token_event(chat)) for chat in (True, False)}
        usage = {"prompt_tokens": 1, "completion_tokens": timing.tokens, "total_tokens": 1 + timing.tokens}
        last = b"data: " + json.dumps({"id": "stub", "choices": [], "usage": usage}).encode() + b"\n\n"
        self.last = http_chunk(last + b"data: [DONE]\n\n") + b"0\r\n\r\n"

    def route(self, method: bytes, path: bytes) -> bytes:
        if path == b"/v1/models":
            return http_response("200 OK", b'{"object":"list","data":[{"id":"stub","object":"model"}]}')
        if path == b"/health":  # GuideLLM checks it before a run
            return http_response("200 OK", b"{}")
        if path == b"/stub/timings":
            return http_response("200 OK", json.dumps([s.truth() for s in self.served if s.end]).encode())
        if path == b"/stub/reset" and method == b"POST":
            self.served.clear()
            return http_response("200 OK", b"{}")
        return http_response("404 Not Found", b'{"error":{"message":"no such route"}}')


class StubConnection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one after another (keep-alive). A completion request is
    answered by timer callbacks at absolute deadlines (`loop.call_at`), not a task per stream: the
    stub's own work per chunk, a write and a clock read, stays small next to 64 streams' gaps."""

    def __init__(self, stub: TimedStub):
        self.stub = stub
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.streaming = False  # a client waits for an answer's end before its next request

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        # Stamped here, when the loop reads the bytes: the request's arrival, before any parsing.
        received = time.perf_counter()
        self.buffer += data
        while not self.streaming and b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            method, path = head.split(b" ", 2)[:2]
            if method == b"POST" and path.endswith(b"completions"):
                self.stream(path.endswith(b"chat/completions"), received)
            else:
                self.transport.write(self.stub.route(method, path))

    def stream(self, chat: bool, received: float) -> None:
        """Schedule every chunk of one answer from its arrival: T, then one every I."""
        served = Served(received)
        self.stub.served.append(served)
        self.streaming = True
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        # loop.time() and perf_counter() are both CLOCK_MONOTONIC here: deadlines count from `received`.
        start = loop.time() - (time.perf_counter() - received)
        timing = self.stub.timing
        for k in range(timing.tokens):
            deadline = start + (timing.ttft_ms + k * timing.itl_ms) / 1000
            loop.call_at(deadline, self.send, served, self.stub.events[chat], k == timing.tokens - 1)

    def send(self, served: Served, event: bytes, last: bool) -> None:
        if self.transport is None:  # the client went away mid-answer
            return
        self.transport.write(event)
        served.sends.append(time.perf_counter())
        if last:
            self.transport.write(self.stub.last)
            served.end = time.perf_counter()
            self.streaming = False
            if self.buffer:  # a pipelined next request
                self.data_received(b"")


def serve(port: int, timing: StubTiming, ready) -> None:
    """The stub's process: serve on 127.0.0.1:`port` until terminated."""
    stub = TimedStub(timing)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: StubConnection(stub), "127.0.0.1", port, backlog=4096)
        ready.set()
        parent = os.getppid()
        # A starter killed without its cleanup must not leave the stub listening.
        while os.getppid() == parent:
            await asyncio.sleep(0.5)
        server.close()

    asyncio.run(main())


def start(port: int, timing: StubTiming) -> mp.Process:
    """Start the stub in a process of its own and wait until it listens; the caller terminates it."""
    ready = mp.get_context("spawn").Event()
    proc = mp.get_context("spawn").Process(target=serve, args=(port, timing, ready), daemon=True)
    proc.start()
    if not ready.wait(30):
        proc.terminate()
        raise RuntimeError("the timing stub did not start within 30 s")
    return proc
