"""The Responses API through the official `openai` client against the live server: `responses.create`
streamed and not, a function tool, a `previous_response_id` chain, `text.format`, the store (GET,
DELETE, another key never reads it), and each bad field a 400 naming it."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import LiveServer

MODEL = "smollm2-135m"
# Bounded, so that a greedy call always closes within the few tokens the tests allow.
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER,
    }
]
ASK = "What is the weather in Paris?"


def test_a_response_streamed_and_not_carry_the_same_text_and_usage(client):
    body = {
        "model": MODEL,
        "input": "What is the capital of France?",
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = client.responses.create(**body, instructions="Answer in one sentence.")
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    [message] = whole.output
    assert message.type == "message" and message.role == "assistant"
    assert "Paris" in whole.output_text
    usage = whole.usage
    assert usage.input_tokens > 10 and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0

    events = list(client.responses.create(**body, instructions="Answer in one sentence.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == whole.output_text
    assert final.usage.input_tokens == usage.input_tokens and final.usage.output_tokens == usage.output_tokens
    # The second identical prompt found its blocks in the prefix cache.
    assert final.usage.input_tokens_details.cached_tokens >= 16


def test_a_function_tool_is_called_streamed_and_not(client):
    body = {"model": MODEL, "input": ASK, "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 40}
    whole = client.responses.create(**body, temperature=0)
    [call] = whole.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)

    events = list(client.responses.create(**body, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    [streamed] = events[-1].response.output
    assert pieces == done.arguments == streamed.arguments == call.arguments

    named = client.responses.create(
        **{**body, "tool_choice": {"type": "function", "name": "get_weather"}}, temperature=0
    )
    assert named.output[0].type == "function_call" and named.output[0].name == "get_weather"


def test_a_previous_response_id_chain_sends_only_the_new_items(client):
    first = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=40, temperature=0
    )
    [call] = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[result],
        tools=TOOLS,
        max_output_tokens=12,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.output_text
    # The chained turn is the whole conversation, its history served by the prefix cache.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 16 * 16 - 16
    # The same conversation sent whole is the same prompt.
    history = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        result,
    ]
    whole = client.responses.create(
        model=MODEL, input=history, tools=TOOLS, max_output_tokens=12, temperature=0, store=False
    )
    assert whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text

    # Tools are the request's own, as OpenAI's: the third turn names them again.
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, input="Thanks!", tools=TOOLS, max_output_tokens=4
    )
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_text_format_json_schema_makes_the_answer_valid_json(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    for stream in (False, True):
        body = {"model": MODEL, "input": "Invent a person.", "text": {"format": fmt}, "max_output_tokens": 40}
        if stream:
            response = list(client.responses.create(**body, temperature=0, stream=True))[-1].response
        else:
            response = client.responses.create(**body, temperature=0)
        assert response.status == "completed" and response.text.format.type == "json_schema"
        jsonschema.validate(json.loads(response.output_text), schema)


def test_max_output_tokens_cuts_an_answer_to_an_incomplete_response(client):
    r = client.responses.create(
        model=MODEL, input="Tell me a long story.", max_output_tokens=3, temperature=0
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_reasoning_items_and_settings_are_accepted_and_change_nothing(client):
    body = {"model": MODEL, "max_output_tokens": 8, "temperature": 0}
    plain = client.responses.create(**body, input=[{"role": "user", "content": "Hello!"}])
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]}
    with_reasoning = client.responses.create(
        **body,
        input=[reasoning, {"role": "user", "content": "Hello!"}],
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        metadata={"run": "1"},
    )
    assert with_reasoning.output_text == plain.output_text
    assert with_reasoning.metadata == {"run": "1"}


def test_a_stored_response_is_read_and_deleted_by_id(client):
    r = client.responses.create(model=MODEL, input="Hi!", max_output_tokens=4, temperature=0)
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text and again.usage == r.usage
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model=MODEL, previous_response_id=r.id, input="more", max_output_tokens=2)
    assert error.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=MODEL, input="Hi!", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "include"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        (
            {
                "input": "x",
                "text": {"format": {"type": "json_schema", "schema": {"type": "object", "not": {}}}},
            },
            "text",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "max_output_tokens": 10**6}, "input"),  # beyond the context, as chat's "prompt"
        ({"input": ""}, "input"),
    ],
)
def test_each_bad_field_is_a_400_naming_it(client, fields, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, **fields)
    assert error.value.body["param"] == param, error.value.body


@pytest.fixture(scope="module")
def keyless_server(model_dir):
    """A server without --api-key: anyone may call it, but a stored response still belongs to the key
    that made it."""
    with LiveServer("--num-kv-blocks", "32", "--max-num-seqs", "4") as s:
        yield s


def test_a_stored_response_is_never_readable_with_another_key(keyless_server):
    alice = openai.OpenAI(base_url=keyless_server.url + "/v1", api_key="alice", max_retries=0)
    mallory = openai.OpenAI(base_url=keyless_server.url + "/v1", api_key="mallory", max_retries=0)
    r = alice.responses.create(model=MODEL, input="A secret.", max_output_tokens=4, temperature=0)
    assert alice.responses.retrieve(r.id).output_text == r.output_text
    with pytest.raises(openai.NotFoundError):
        mallory.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.create(model=MODEL, previous_response_id=r.id, input="and?", max_output_tokens=2)
    anonymous = httpx.get(f"{keyless_server.url}/v1/responses/{r.id}")
    assert anonymous.status_code == 404 and anonymous.json()["error"]["code"] == "not_found"
    assert alice.responses.retrieve(r.id).id == r.id  # still there for its owner
