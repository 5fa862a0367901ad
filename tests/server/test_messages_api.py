"""Anthropic's Messages API through the official `anthropic` client against the live server:
`messages.create` with a tool, streamed and not, a tool result sent back, stop sequences, usage with
cache_read_input_tokens from the prefix cache, count_tokens, x-api-key and bearer auth, and Anthropic's
error shape on its route."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.conftest import API_KEY

MODEL = "smollm2-135m"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
}
TOOLS = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}  # this client version no longer sends temperature itself


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    """The client as Claude Code configures it: its key as x-api-key."""
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def test_a_tool_is_called_streamed_and_not(claude):
    body = {"model": MODEL, "max_tokens": 40, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "any"}}
    whole = claude.messages.create(**body, **GREEDY)
    assert whole.type == "message" and whole.role == "assistant" and whole.stop_reason == "tool_use"
    [call] = whole.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER)
    assert (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens > 50 and whole.usage.output_tokens > 0
    )

    with claude.messages.stream(**body, **GREEDY) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert deltas and all(d.type == "input_json_delta" for d in deltas)
    assert json.loads("".join(d.partial_json for d in deltas)) == call.input
    [streamed_call] = streamed.content
    assert (streamed_call.name, streamed_call.input) == (call.name, call.input)
    assert streamed.stop_reason == "tool_use" and streamed.usage.output_tokens == whole.usage.output_tokens
    total = streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
    assert total == whole.usage.input_tokens + whole.usage.cache_read_input_tokens

    named = claude.messages.create(
        **{**body, "tool_choice": {"type": "tool", "name": "get_weather"}}, **GREEDY
    )
    assert named.content[0].type == "tool_use" and named.content[0].name == "get_weather"


def test_a_tool_result_goes_back_and_the_answer_is_text(claude):
    first = claude.messages.create(
        model=MODEL, max_tokens=40, messages=ASK, tools=TOOLS, tool_choice={"type": "any"}, **GREEDY
    )
    [call] = first.content
    history = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}],
        },
    ]
    answer = claude.messages.create(model=MODEL, max_tokens=16, messages=history, tools=TOOLS, **GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    # The history's prefix (system prompt, tools, question) came from the prefix cache.
    assert answer.usage.cache_read_input_tokens >= 48


def test_text_streamed_and_not_agree_and_a_stop_sequence_is_named(claude):
    body = {"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": "Count from 1 to 9."}]}
    whole = claude.messages.create(**body, system="You count.", **GREEDY)
    [block] = whole.content
    assert block.type == "text" and block.text
    with claude.messages.stream(**body, system="You count.", **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == block.text
    assert final.stop_reason == whole.stop_reason

    stop = block.text.split()[1] if len(block.text.split()) > 1 else block.text[1:3]
    cut = claude.messages.create(**body, system="You count.", stop_sequences=["zzz", stop], **GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert block.text.startswith(cut.content[0].text) and stop not in cut.content[0].text


def test_usage_reads_the_prefix_cache_and_count_tokens_counts_the_prompt(claude):
    system = [
        {
            "type": "text",
            "text": "You are a careful assistant for a weather service. " * 6,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    body = {"model": MODEL, "max_tokens": 4, "system": system, "messages": ASK, "tools": TOOLS}
    claude.messages.create(**body, **GREEDY)
    again = claude.messages.create(**body, **GREEDY)
    assert again.usage.cache_read_input_tokens >= 64 and again.usage.cache_creation_input_tokens == 0
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=ASK, tools=TOOLS)
    assert counted.input_tokens == again.usage.input_tokens + again.usage.cache_read_input_tokens


def test_the_key_is_taken_as_x_api_key_or_bearer_and_errors_are_anthropics(server, claude):
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(model=MODEL, max_tokens=2, messages=ASK).content is not None
    with pytest.raises(anthropic.AuthenticationError) as error:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=ASK
        )
    assert error.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as error:
        claude.messages.create(model=MODEL, max_tokens=2, messages=ASK, stop_sequences=[""])
    assert (
        error.value.body["type"] == "error" and error.value.body["error"]["type"] == "invalid_request_error"
    )
    assert "stop_sequences" in error.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nope", max_tokens=2, messages=ASK)
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, content=b"{", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
                ]
            },
            "image",
        ),
        ({"messages": ASK, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "server tools"),
        ({"messages": ASK, "tool_choice": {"type": "any"}}, "tool_choice"),
        ({"messages": ASK, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"messages": ASK, "max_tokens": 10**6}, "context length"),
    ],
)
def test_each_bad_field_is_a_400_naming_it(server, fields, words):
    body = {"model": MODEL, "max_tokens": 4, **fields}
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and words in r.json()["error"]["message"]
