"""The Responses and Messages APIs' translation into the one internal chat request, and their writers
fed the same pieces a chat stream carries, without a model: items and blocks become chat messages and
tools, every bad field is a 400 naming it, and a stream's events add up to the body's output."""

from __future__ import annotations

import json

import pytest

from llmopt.server.error_bodies import APIError
from llmopt.server.messages_api import MessagesRequest, matched_stop
from llmopt.server.messages_api import chat_call as messages_call
from llmopt.server.messages_events import ContentBlocks
from llmopt.server.responses_api import ResponsesRequest, input_items
from llmopt.server.responses_api import chat_call as responses_call
from llmopt.server.responses_events import OutputItems
from llmopt.server.tool_parsers import ToolCallDelta

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def responses(**fields):
    req = ResponsesRequest(**fields)
    return responses_call(req, input_items(req.input))


def test_responses_items_become_one_chat_conversation():
    call = responses(
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather "},
                    {"type": "input_text", "text": "in Paris?"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me look."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "get_weather",
                "arguments": '{"city": "Lyon"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "rain"}],
            },
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=12,
        temperature=0,
    )
    req = call.request
    assert [(m.role, m.text()) for m in req.messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Paris?"),
        ("assistant", "Let me look."),
        ("tool", "sunny"),
        ("tool", "rain"),
    ]
    assert [c.id for c in req.messages[2].tool_calls] == ["c1", "c2"]
    assert req.messages[3].tool_call_id == "c1"
    assert req.tools[0].function.name == "get_weather" and req.tools[0].function.parameters == WEATHER
    assert req.tool_choice.function.name == "get_weather"
    assert (req.max_tokens, req.temperature, req.n) == (12, 0, 1)
    assert call.names["messages"] == "input" and call.requested is None


def test_a_function_call_with_no_assistant_message_before_it_opens_one():
    call = responses(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    [message] = call.request.messages
    assert message.role == "assistant" and message.content is None and message.tool_calls[0].id == "c"


def test_text_format_is_the_structured_output_and_its_errors_name_text():
    fmt = {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}
    call = responses(input="hi", text={"format": fmt})
    assert call.requested.param == "text" and json.loads(call.requested.output.spec) == WEATHER
    assert responses(input="hi", text={"format": {"type": "text"}}).requested is None
    for bad in ({"format": {"type": "json_schema"}}, {"format": {"type": "yaml"}}, {"format": "json"}):
        with pytest.raises(APIError) as error:
            responses(input="hi", text=bad)
        assert error.value.status == 400 and error.value.param == "text"


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "input[0].content[0]",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "'item_reference'"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            "input",
            "JSON",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input", "input[0].call_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools", "'web_search'"),
        ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice", "tool_choice"),
    ],
)
def test_each_bad_responses_field_is_a_400_naming_it(fields, param, words):
    with pytest.raises(APIError) as error:
        responses(**fields)
    assert error.value.status == 400 and error.value.param == param and words in error.value.message


def test_fields_asking_for_what_the_server_does_not_do_are_named():
    assert ResponsesRequest(input="x", background=True).unsupported_field() == "background"
    assert ResponsesRequest(input="x", truncation="auto").unsupported_field() == "truncation"
    assert (
        ResponsesRequest(input="x", include=["message.output_text.logprobs"]).unsupported_field() == "include"
    )
    neutral = {"background": False, "truncation": "disabled", "include": ["reasoning.encrypted_content"]}
    assert ResponsesRequest(input="x", reasoning={"effort": "low"}, **neutral).unsupported_field() is None


PIECES = [
    "Checking",
    " now.",
    ToolCallDelta(0, '{"city": ', "call_1", "get_weather"),
    ToolCallDelta(0, '"Paris"}'),
]


def test_a_stream_of_response_events_adds_up_to_the_bodys_items():
    output = OutputItems()
    events = [e for piece in PIECES for e in output.add(piece)] + output.finish("tool_calls")
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    message, call = output.items
    assert message["content"][0]["text"] == "Checking now." and message["status"] == "completed"
    assert call["call_id"] == "call_1" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert events[7]["item"]["arguments"] == "" and events[7]["item"]["status"] == "in_progress"
    assert events[-1]["item"] == call and [e["output_index"] for e in events[-5:]] == [1] * 5
    empty = OutputItems()
    assert [e["type"] for e in empty.finish("length")][-1] == "response.output_item.done"
    assert empty.items[0]["status"] == "incomplete" and empty.items[0]["content"][0]["text"] == ""


def messages(**fields):
    return messages_call(MessagesRequest(model="m", max_tokens=8, **fields))


def test_messages_blocks_become_one_chat_conversation():
    call = messages(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "down"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Try again."},
                ],
            },
        ],
        tools=[
            {
                "name": "get_weather",
                "description": "d",
                "input_schema": WEATHER,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0,
        top_k=5,
    )
    req = call.request
    assert [(m.role, m.text()) for m in req.messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Paris?"),
        ("assistant", "Looking."),
        ("tool", "Error: down"),
        ("user", "Try again."),
    ]
    [tool_call] = req.messages[2].tool_calls
    assert tool_call.id == "t1" and json.loads(tool_call.function.arguments) == {"city": "Paris"}
    assert req.tool_choice.function.name == "get_weather" and req.parallel_tool_calls is False
    assert (req.stop, req.max_tokens, req.temperature, req.top_k) == (["END"], 8, 0, 5)
    assert call.names["stop"] == "stop_sequences"
    assert (
        messages(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "any"}).request.tool_choice
        == "required"
    )


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages",
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                    }
                ]
            },
            "messages",
            "tool_use",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools",
            "server tools",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}},
            "tool_choice",
            "tool_choice",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "regex"}}},
            "output_config",
            "json_schema",
        ),
    ],
)
def test_each_bad_messages_field_is_a_400_naming_it(fields, param, words):
    with pytest.raises(APIError) as error:
        messages(**fields)
    assert error.value.status == 400 and error.value.param == param and words in error.value.message


def test_stop_sequences_are_bounded_as_chats_stop():
    with pytest.raises(ValueError, match="stop_sequences"):
        MessagesRequest(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}], stop_sequences=[""]
        )


def test_the_stop_sequence_is_the_one_where_the_text_was_cut():
    assert matched_stop("one, two, three", "one, two, ", ["three", "two"]) == "three"
    assert matched_stop("a b", "a ", ["b", "b c"]) == "b"
    assert matched_stop("no stop here", "no stop here", ["zzz"]) is None


def test_a_stream_of_message_events_adds_up_to_the_bodys_blocks():
    blocks = ContentBlocks()
    events = [e for piece in PIECES for e in blocks.add(piece)] + blocks.close()
    assert [(e["type"], e.get("delta", {}).get("type")) for e in events] == [
        ("content_block_start", None),
        ("content_block_delta", "text_delta"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
    ]
    text, call = blocks.blocks
    assert text == {"type": "text", "text": "Checking now."}
    assert call == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    assert events[4]["content_block"]["input"] == {} and events[4]["index"] == 1
