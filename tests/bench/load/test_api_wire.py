"""The bench through each API against the scripted endpoint: a request's body as the Responses and
Messages APIs take it, their streams and whole answers read into the same record (text, timing, usage
with the cached and written parts), agent sessions chained by previous_response_id through the
Responses API, and the cost model pricing cached input from each API's usage."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.messages_wire import anthropic_messages, messages_payload
from llmopt.bench.load.responses_wire import input_items, responses_payload
from llmopt.bench.load.runner import run_point
from llmopt.bench.schema import RequestRecord
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.cost.from_run import usage_of
from tests.bench.conftest import answer, responses_answer

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
}
HISTORY = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
]
TOOL = {
    "type": "function",
    "function": {"name": "read_file", "description": "d", "parameters": {"type": "object"}},
}


def test_chat_messages_become_responses_items_and_anthropic_blocks():
    req = BenchRequest(
        messages=HISTORY, max_tokens=5, tools=[TOOL], previous_response_id="resp_1", store=True
    )
    body = responses_payload("m", req, stream=True, ignore_eos=True)
    assert body["instructions"] == "You are an agent." and body["previous_response_id"] == "resp_1"
    assert (
        body["input"]
        == input_items(HISTORY[1:])
        == [
            {"type": "message", "role": "user", "content": "Fix the bug."},
            {"type": "message", "role": "assistant", "content": "Looking."},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "read_file",
                "arguments": '{"path": "a.py"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "print(1)"},
        ]
    )
    assert body["tools"] == [
        {"type": "function", "name": "read_file", "description": "d", "parameters": {"type": "object"}}
    ]
    assert (body["max_output_tokens"], body["store"], body["ignore_eos"], body["temperature"]) == (
        5,
        True,
        True,
        0,
    )

    body = messages_payload("m", req, stream=False, ignore_eos=False)
    assert body["system"] == "You are an agent." and "ignore_eos" not in body and body["max_tokens"] == 5
    assert (
        body["messages"]
        == anthropic_messages(HISTORY[1:])
        == [
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.py"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "print(1)"}],
            },
        ]
    )
    assert body["tools"] == [{"name": "read_file", "input_schema": {"type": "object"}, "description": "d"}]


def run(endpoint, api: str, stream: bool, requests: int = 2):
    target = Target(endpoint.url, "scripted", api=api, api_key="k", stream=stream)
    work = [BenchRequest(prompt="hi", max_tokens=3, prompt_tokens=1)]
    result = asyncio.run(run_point(target, work, LoadPoint(concurrency=1, num_requests=requests)))
    return sorted(result.records, key=lambda r: r.index)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_responses_answer_is_read_into_the_record(openai_endpoint, stream):
    records = run(openai_endpoint, "responses", stream)
    assert all(r.success for r in records), [r.error for r in records]
    first = records[0]
    assert (first.output_tokens, first.prompt_tokens, first.cached_tokens) == (3, 10, 4)
    assert first.finish_reason == "stop" and first.tokens_from == "usage" and first.ttft is not None
    assert first.response_id == "resp_1" and "response_id" not in json.loads(first.to_json())
    if stream:
        assert len(first.itl) == 2  # three deltas, timed as chat's chunks
    path, body = openai_endpoint.seen[0]
    assert path == "/v1/responses" and body["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert body["store"] is False  # nothing continues a lone request


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_messages_answer_is_read_into_the_record_with_its_cache_read_and_write(openai_endpoint, stream):
    records = run(openai_endpoint, "messages", stream)
    assert all(r.success for r in records), [r.error for r in records]
    first = records[0]
    # 3 uncached + 5 read + 2 written: the prompt is all three, as Anthropic counts them apart.
    assert (first.prompt_tokens, first.cached_tokens, first.cache_write_tokens) == (10, 5, 2)
    assert first.output_tokens == 3 and first.finish_reason in ("length", "stop")
    assert json.loads(first.to_json())["cache_write_tokens"] == 2
    assert openai_endpoint.auth[0] == "Bearer k"  # and x-api-key, which Anthropic's API reads
    bill = usage_of(RequestRecord.from_json(json.loads(first.to_json())), writes=False)
    assert (bill.prompt_tokens, bill.cached_tokens, bill.cache_write_tokens) == (10, 5, 2)


def test_an_error_event_fails_its_request_alone(openai_endpoint):
    def failed(handler, request):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        event = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
        handler.wfile.write(f"event: error\ndata: {json.dumps(event)}\n\n".encode())

    openai_endpoint.replies += [failed, answer(400, '{"type": "error", "error": {"message": "bad tools"}}')]
    first, second, third = run(openai_endpoint, "messages", True, requests=3)
    assert first.error == "stream error: busy" and second.error == "HTTP 400: bad tools"
    assert third.success


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def agent_config(endpoint: str, api: str) -> BenchConfig:
    return BenchConfig.from_settings(
        endpoint=endpoint,
        api=api,
        workload="agent",
        sessions=[1],
        turns=3,
        system_len=40,
        prompt_lens=[6],
        output_lens=[2],
        num_requests=3,
        warmup=0,
    )


def test_responses_sessions_are_chained_by_previous_response_id(openai_endpoint, tokenizer, tmp_path):
    [point] = run_sweep(agent_config(openai_endpoint.url, "responses"), tmp_path / "r", False, tokenizer)
    assert point.successful == 3 and point.cached_tokens == 3 * 4
    assert (point.chained_turns, point.replayed_turns) == (2, 0)
    bodies = [body for _, body in openai_endpoint.seen]
    assert "previous_response_id" not in bodies[0] and bodies[0]["store"] is True
    assert [b.get("previous_response_id") for b in bodies[1:]] == ["resp_1", "resp_2"]
    assert bodies[-1]["store"] is False  # the last turn is continued by none
    for body in bodies:
        assert body["instructions"].startswith("You are a coding agent") and body["tools"]
    # A chained turn sends only what is new: the (synthetic) tool call and its result.
    kinds = [item["type"] for item in bodies[1]["input"]]
    assert kinds == ["function_call", "function_call_output"]
    assert bodies[1]["input"][0]["call_id"] == bodies[1]["input"][1]["call_id"]


def test_a_server_that_refuses_chaining_gets_the_whole_history(openai_endpoint, tokenizer, tmp_path):
    refusal = answer(400, '{"error": {"message": "llama.cpp does not support \'previous_response_id\'."}}')
    openai_endpoint.replies += [responses_answer, refusal, responses_answer, responses_answer]
    [point] = run_sweep(agent_config(openai_endpoint.url, "responses"), tmp_path / "r", False, tokenizer)
    assert point.successful == 3 and point.failed == 0  # the refused turn was sent again, not failed
    assert (point.chained_turns, point.replayed_turns) == (0, 2)
    bodies = [body for _, body in openai_endpoint.seen]
    assert [("previous_response_id" in b, len(b["input"])) for b in bodies] == [
        (False, 1),
        (True, 2),
        (False, 4),
        (False, 7),
    ]


@pytest.mark.parametrize("api", ["messages", "chat"])
def test_other_apis_replay_the_whole_history(openai_endpoint, tokenizer, tmp_path, api):
    [point] = run_sweep(agent_config(openai_endpoint.url, api), tmp_path / "r", False, tokenizer)
    assert point.successful == 3
    bodies = [body for _, body in openai_endpoint.seen]
    assert [len(b["messages"]) for b in bodies] == (
        [1, 3, 5] if api == "messages" else [2, 4, 6]
    )  # system apart


def test_completions_cannot_carry_a_conversation():
    from llmopt.bench.bench_error import BenchError

    with pytest.raises(BenchError, match="needs --api chat or responses or messages"):
        agent_config("http://127.0.0.1:1/v1", "completions").validate()
    agent_config("http://127.0.0.1:1/v1", "responses").validate()
