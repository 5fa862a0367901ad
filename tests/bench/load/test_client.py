"""The client against bad servers: whatever one response does, it fails that request alone, with the
reason in its record, and the load point goes on. No request is ever sent twice."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmopt.bench.load import client
from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point
from llmopt.bench.schema import RequestRecord
from tests.bench.conftest import content, hang_up, sse

USAGE = b'{"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'


def run(endpoint, requests: int = 2, timeout_s: float = 30.0) -> list[RequestRecord]:
    """`requests` requests one after another (concurrency 1: the scripted replies go in order)."""
    target = Target(endpoint.url, "scripted", timeout_s=timeout_s)
    work = [BenchRequest(prompt="hi", max_tokens=3, prompt_tokens=1)]
    result = asyncio.run(run_point(target, work, LoadPoint(concurrency=1, num_requests=requests)))
    return sorted(result.records, key=lambda r: r.index)


MALFORMED = [
    (sse(b"5"), "malformed chunk: not a JSON object: b'5'"),
    (sse(b"[1, 2]"), "not a JSON object"),
    (sse(b'"text"'), "not a JSON object"),
    (sse(b"{oops"), "malformed chunk: not JSON"),
    (sse(b'{"choices": [5]}'), "choices is not a list of objects"),
    (sse(b'{"choices": 5}'), "choices is not a list of objects"),
    (sse(b'{"choices": [{"delta": 5}]}'), "delta is not an object"),
    (sse(b'{"choices": [{"delta": {"content": 5}}]}'), "content is not a string: 5"),
    (sse(b'{"choices": [{"text": ["a"]}]}'), "content is not a string"),
    (sse(content("a"), b'{"choices": [], "usage": 5}'), "usage is not an object: 5"),
    (sse(content("a"), b'{"choices": [], "usage": [1]}'), "usage is not an object"),
    (sse(content("a"), b'{"usage": {"completion_tokens": "3"}}'), "completion_tokens is not a count: 3"),
    (sse(content("a"), b'{"usage": {"completion_tokens": 1, "prompt_tokens_details": 7}}'), "details"),
    (sse(content("a"), b'{"error": {"message": "out of memory"}}'), "stream error: out of memory"),
    (sse(content("a"), USAGE, done=False), "stream ended without [DONE]"),
    (sse(done=False), "stream ended without [DONE]"),
    (sse(USAGE), "no content received"),
    (sse(b'{"choices": [{"delta": {"tool_calls": {"a": 1}}}]}'), "tool_calls is not a list of objects"),
    (sse(b'{"choices": [{"delta": {"tool_calls": [{"function": 5}]}}]}'), "function is no object"),
]


@pytest.mark.parametrize(("reply", "error"), MALFORMED, ids=[e for _, e in MALFORMED])
def test_a_malformed_response_fails_its_request_and_the_point_goes_on(openai_endpoint, reply, error):
    openai_endpoint.replies.append(reply)
    bad, good = run(openai_endpoint)
    assert not bad.success and error in bad.error
    assert good.success and good.error is None and good.output_tokens == 3


def test_a_line_longer_than_aiohttps_readline_takes_is_read_whole(openai_endpoint):
    long = "x" * (600 * 2**10)  # aiohttp's readline raises LineTooLong past 128 KiB
    openai_endpoint.replies.append(sse(content(long), USAGE))
    [record] = run(openai_endpoint, requests=1)
    assert record.success and record.error is None and record.output_tokens == 1


def test_a_line_over_the_clients_limit_fails_its_request(openai_endpoint, monkeypatch):
    monkeypatch.setattr(client, "MAX_LINE_BYTES", 256 * 2**10)
    openai_endpoint.replies.append(sse(content("x" * (600 * 2**10)), USAGE))
    bad, good = run(openai_endpoint)
    assert not bad.success and bad.error == f"a stream line over {256 * 2**10} bytes"
    assert good.success


def test_lines_split_across_reads_and_crlf_line_ends_are_read(openai_endpoint):
    chunks = b"".join(b"data: " + content(w) + b"\r\n\r\n" for w in ("a", "b", "c"))
    body = chunks + b"data: " + USAGE + b"\r\n\r\ndata: [DONE]\r\n\r\n"

    def reply(handler, request) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        for i in range(0, len(body), 7):  # a line in many pieces
            handler.wfile.write(body[i : i + 7])
            handler.wfile.flush()

    openai_endpoint.replies.append(reply)
    [record] = run(openai_endpoint, requests=1)
    assert record.success and len(record.itl) == 2 and record.output_tokens == 1


def test_a_connection_closed_before_any_answer_byte_is_sent_again_once_on_a_fresh_one(openai_endpoint):
    openai_endpoint.replies.append(hang_up)  # no byte of an answer: the request never ran
    first, second = run(openai_endpoint)
    assert len(openai_endpoint.seen) == 3  # the first request twice, the second once
    assert first.success and first.reconnects == 1 and second.success and second.reconnects == 0


def test_a_request_closed_again_after_its_one_resend_is_a_failure(openai_endpoint):
    openai_endpoint.replies += [hang_up, hang_up]
    first, second = run(openai_endpoint)
    assert len(openai_endpoint.seen) == 3
    assert not first.success and first.error.startswith("ServerDisconnectedError") and first.reconnects == 1
    assert second.success


def test_a_stream_cut_after_its_first_bytes_is_a_failure_and_is_never_sent_again(openai_endpoint):
    def cut(handler, request) -> None:  # the answer began: the request ran, a re-send would count twice
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        handler.wfile.write(b"data: " + content("a") + b"\n\n")
        handler.wfile.flush()
        handler.close_connection = True

    openai_endpoint.replies.append(cut)
    first, second = run(openai_endpoint)
    assert len(openai_endpoint.seen) == 2
    assert not first.success and first.reconnects == 0 and second.success


def test_an_http_error_keeps_its_status_and_message(openai_endpoint):
    from tests.bench.conftest import answer

    openai_endpoint.replies.append(answer(503, json.dumps({"error": {"message": "overloaded"}})))
    bad, good = run(openai_endpoint)
    assert (bad.status, bad.error, bad.success) == (503, "HTTP 503: overloaded", False)
    assert good.success


def test_a_streamed_tool_call_is_output_timed_from_its_first_piece(openai_endpoint):
    def call(piece: dict) -> bytes:
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]}).encode()

    first = {"index": 0, "id": "c1", "type": "function", "function": {"name": "search_docs", "arguments": ""}}
    openai_endpoint.replies.append(
        sse(call(first), call({"index": 0, "function": {"arguments": '{"q": 1}'}}), USAGE)
    )
    [record] = run(openai_endpoint, requests=1)
    assert record.success and record.ttft is not None and len(record.itl) == 1
    assert record.text == 'search_docs{"q": 1}'
