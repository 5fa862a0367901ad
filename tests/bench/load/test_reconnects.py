"""A server that closes kept-alive connections, as llama.cpp's does: this one reads the third request of
every connection and closes it without a byte of answer, after a pause. The bench sends such a request
once more on a fresh connection, times it from that send, counts the reconnect, and loses nothing."""

from __future__ import annotations

import asyncio
import json
import re
import statistics

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point
from llmopt.bench.measure.request_metrics import summarize

ANSWERED_PER_CONNECTION = 2
DROP_AFTER_S = 0.2  # the dropped send's wait: a TTFT timed from it would be over 0.25 s
TTFT_S, ITL_S, TOKENS = 0.05, 0.005, 4
TOLERANCE_S = 0.015  # as tests/bench/load/test_timing_accuracy.py: a busy 2-core machine wakes late


class DroppingServer:
    """An OpenAI-style streaming endpoint on 127.0.0.1 that answers ANSWERED_PER_CONNECTION requests
    per connection and drops the connection on the next one."""

    def __init__(self) -> None:
        self.answered = 0
        self.dropped = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                json.loads(await reader.readexactly(length))
                if served == ANSWERED_PER_CONNECTION:
                    await asyncio.sleep(DROP_AFTER_S)
                    self.dropped += 1
                    return
                served += 1
                await self.stream(writer)
                self.answered += 1
        except asyncio.IncompleteReadError:
            return  # the client closed the connection
        finally:
            writer.close()

    async def stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: keep-alive\r\n\r\n"
        )
        await asyncio.sleep(TTFT_S)
        usage = {"prompt_tokens": 1, "completion_tokens": TOKENS}
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(ITL_S)
            delta = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]}
            self.chunk(writer, b"data: " + json.dumps(delta).encode() + b"\n\n")
            await writer.drain()
        self.chunk(writer, b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.chunk(writer, b"data: [DONE]\n\n")
        self.chunk(writer, b"")
        await writer.drain()

    @staticmethod
    def chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def bench_against_dropping_server(concurrency: int, requests: int):
    server = DroppingServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        target = Target(f"http://127.0.0.1:{port}/v1", "stub")  # keep-alive on: the default
        work = [BenchRequest(prompt="hi", max_tokens=TOKENS, prompt_tokens=1)]
        result = await run_point(target, work, LoadPoint(concurrency=concurrency, num_requests=requests))
    finally:
        listener.close()
        await listener.wait_closed()
    return server, result


def test_requests_on_connections_the_server_closed_are_sent_again_and_nothing_is_lost():
    server, result = asyncio.run(bench_against_dropping_server(concurrency=4, requests=24))
    records = result.records
    assert [r.error for r in records if not r.success] == []
    summary = summarize(records, result.wall_s)
    assert summary["failed"] == 0 and summary["successful"] == 24
    assert summary["reconnects"] == sum(r.reconnects for r in records) == server.dropped > 0
    assert server.answered == 24  # each request served once: no re-send of one that got an answer
    reconnected = [r for r in records if r.reconnects]
    # Timed from the send that worked: the dropped send's 0.2 s is not in the TTFT.
    ttft = statistics.median(r.ttft for r in reconnected)
    assert TTFT_S <= ttft < TTFT_S + TOLERANCE_S, ttft
    assert statistics.median(r.ttft for r in records) < TTFT_S + TOLERANCE_S
