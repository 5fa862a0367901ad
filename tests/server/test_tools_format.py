"""Tools without a model: how tools, earlier calls and results are written into the prompt, the JSON
schema that constrains a required call, each parser on strings (whole and fed a character at a time),
and the response bodies a parser's pieces make."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from llmopt.engine.outputs import RequestOutput
from llmopt.server.error_bodies import APIError
from llmopt.server.protocol import ChatCompletionRequest, ChatMessage
from llmopt.server.responses import CHAT_COMPLETION, Reply, complete
from llmopt.server.tool_parsers import ArrayParser, MarkupParser, NamedParser, ToolCallDelta, assemble
from llmopt.server.tools import ToolChoice, template_handles_tools, template_messages
from tests.server.test_responses import ReplayedGroup, events

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters
NAMES = frozenset({"get_weather", "get_time"})


def choice_of(tools: list[dict] | None, tool_choice=None, parallel: bool = True) -> ToolChoice | None:
    """A ToolChoice as a chat request's fields give it (parsed as the server parses them)."""
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
    )
    return ToolChoice.of(req.tools, req.tool_choice, req.parallel_tool_calls)


def messages(*dicts: dict) -> list[ChatMessage]:
    return [ChatMessage.model_validate(d) for d in dicts]


def test_tools_are_written_into_the_system_message():
    tools = choice_of([WEATHER, TIME])
    [system, user] = template_messages(messages({"role": "user", "content": "Weather?"}), tools, native=False)
    assert system["role"] == "system" and user == {"role": "user", "content": "Weather?"}
    inside = system["content"].split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in inside.splitlines()] == [WEATHER, TIME]
    assert '<tool_call>\n{"name": "<function name>", "arguments"' in system["content"]
    assert "one such block for each call" in system["content"]
    # The client's own system message comes first, the tools after it; one call only is asked for.
    merged = template_messages(
        messages({"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}),
        choice_of([WEATHER], parallel=False),
        native=False,
    )
    assert len(merged) == 2 and merged[0]["content"].startswith("Be brief.\n\n# Tools\n")
    assert "at most one function" in merged[0]["content"]


def test_a_conversation_without_tools_is_rendered_as_before():
    plain = messages({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
    assert template_messages(plain, None, native=False) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
    ]


def test_earlier_calls_and_results_are_replayed_as_markup():
    history = messages(
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    )
    rendered = template_messages(history, None, native=False)
    assert [m["role"] for m in rendered] == ["user", "assistant", "user"]  # results share one user turn
    assert rendered[1]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    assert (
        rendered[2]["content"]
        == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
    )


def test_a_template_that_renders_tools_gets_them_as_transformers_takes_them():
    qwen_like = (
        "{%- if tools %}{{- '<tools>' }}{%- for tool in tools %}{{ tool | tojson }}{% endfor %}{% endif %}"
    )
    assert template_handles_tools(qwen_like)
    smollm2 = (
        "{% for message in messages %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content']}}{% endfor %}"
    )
    assert not template_handles_tools(smollm2) and not template_handles_tools(None)
    assert not template_handles_tools({"default": qwen_like})  # several named templates: not handled
    history = messages(
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "get_time", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    )
    assert template_messages(history, choice_of([TIME]), native=True) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {}}}
            ],
        },
        {"role": "tool", "content": "noon", "tool_call_id": "c1"},
    ]
    assert choice_of([WEATHER]).template_tools() == [WEATHER]


def nested(depth: int) -> dict:
    """An object schema whose properties nest `depth` levels deep (past what a grammar compiles)."""
    inner: dict = {"type": "string"}
    for _ in range(depth):
        inner = {"type": "object", "properties": {"a": inner}}
    return inner


BAD = [
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
    (None, "required", "tool_choice"),
    (None, {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
    ([WEATHER, WEATHER], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": nested(70)}}], "auto", "tools"),
]


@pytest.mark.parametrize("tools, tool_choice, param", BAD)
def test_bad_tools_or_tool_choice_are_a_400_naming_the_field(tools, tool_choice, param):
    with pytest.raises(APIError) as refused:
        choice_of(tools, tool_choice)
    assert refused.value.status == 400 and refused.value.param == param


def test_a_replayed_call_whose_arguments_are_no_json_is_a_400():
    bad = messages(
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{city: x"}}]}
    )
    for native in (False, True):
        with pytest.raises(APIError) as refused:
            template_messages(bad, None, native=native)
        assert refused.value.param == "messages" and "messages[0].tool_calls[0]" in refused.value.message


def test_tool_choice_none_and_auto_without_tools_ask_for_nothing():
    assert choice_of(None, "auto") is None and choice_of([], "none") is None
    assert choice_of([WEATHER]).mode == "auto"
    assert choice_of([WEATHER], "none").parser() is None


def test_the_required_schema_admits_exactly_calls_of_declared_functions():
    schema = choice_of([WEATHER, TIME], "required").constraint()
    ok = [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]
    jsonschema.validate(ok, schema)
    for wrong in (
        [],
        [{"name": "get_news", "arguments": {}}],
        [{"name": "get_weather", "arguments": {"unit": "celsius"}}],  # city is required
        [{"name": "get_weather", "arguments": {"city": "Oslo"}, "extra": 1}],
        [{"name": "get_time"}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    single = choice_of([WEATHER, TIME], "required", parallel=False).constraint()
    jsonschema.validate(ok[:1], single)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok, single)


def test_defs_move_to_the_root_of_the_required_schema():
    point = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    params = {"type": "object", "properties": {"at": {"$ref": "#/$defs/point"}}, "$defs": {"point": point}}
    tool = {"type": "function", "function": {"name": "go", "parameters": params}}
    schema = choice_of([tool], "required").constraint()
    assert schema["$defs"] == {"point": point}
    jsonschema.validate([{"name": "go", "arguments": {"at": {"x": 1}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "go", "arguments": {"at": {"y": 1}}}], schema)
    other = {
        "type": "function",
        "function": {"name": "run", "parameters": {**params, "$defs": {"point": {}}}},
    }
    with pytest.raises(APIError) as clash:
        choice_of([tool, other], "required").constraint()
    assert clash.value.param == "tools"


def test_a_named_function_is_constrained_to_its_parameters():
    assert choice_of([WEATHER, TIME], WEATHER_CHOICE).constraint() == WEATHER["function"]["parameters"]
    assert choice_of(
        [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}
    ).constraint() == {
        "type": "object",
        "properties": {},
    }
    assert choice_of([WEATHER], "auto").constraint() is None


WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}


def parse(parser, text: str, step: int | None = None) -> tuple[str, list[dict]]:
    """Feed `text` whole (step None) or `step` characters at a time, then finish."""
    pieces = []
    if step is None:
        pieces += parser.feed(text)
    else:
        for i in range(0, len(text), step):
            pieces += parser.feed(text[i : i + step])
    return assemble(pieces + parser.finish())


def calls(found: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found]


MARKUP_CASES = [
    # (text, content, calls)
    ("Paris is sunny today.\n", "Paris is sunny today.\n", []),
    ("a < b and <tool is not a call", "a < b and <tool is not a call", []),
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
        "Let me check.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "parameters": {}}</tool_call>',
        "",
        [("get_weather", {"city": "A"}), ("get_time", {})],
    ),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', None, []),  # bad JSON
    ('<tool_call>{"name": "get_news", "arguments": {}}</tool_call>', None, []),  # no such function
    ('<tool_call>{"name": "get_time", "arguments": {}}', None, []),  # never closed
    (
        '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>',
        "",
        [("get_time", {"tz": "UTC"})],
    ),
    ("<tool_call>[[[[" + "[" * 5000 + "</tool_call>", None, []),  # nested past the JSON parser's depth
]


@pytest.mark.parametrize("text, content, expected", MARKUP_CASES)
def test_auto_reads_tool_call_markup_whatever_the_chunking(text, content, expected):
    for step in (None, 1, 3, 7):
        got_content, found = parse(MarkupParser(NAMES), text, step)
        assert got_content == (text if content is None else content), step
        assert calls(found) == expected
        assert all(c["id"].startswith("call_") and c["type"] == "function" for c in found)


def test_auto_holds_back_only_what_may_be_a_call():
    parser = MarkupParser(NAMES)
    assert parser.feed("Hello <tool") == ["Hello"]
    assert parser.feed("box> there") == [" <toolbox> there"]
    assert parser.feed(" <tool_call>{") == []
    [delta] = parser.feed('"name": "get_time", "arguments": {}}</tool_call>')
    assert isinstance(delta, ToolCallDelta) and delta.name == "get_time" and delta.index == 0
    assert parser.calls == 1 and parser.finish() == []


def test_auto_without_parallel_calls_reads_the_first_call_only():
    one = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    content, found = parse(MarkupParser(NAMES, parallel=False), one + "\n" + one)
    assert calls(found) == [("get_time", {})] and content == one


def test_required_hands_out_each_call_once_its_element_is_complete():
    parser = ArrayParser(NAMES)
    assert parser.feed(' [{"name": "get_weather", "arguments": {"city": "Pa') == []
    [first] = parser.feed('ris"}}, {"name": "get_ti')
    assert (first.index, first.name, json.loads(first.arguments)) == (0, "get_weather", {"city": "Paris"})
    [second] = parser.feed('me", "arguments": {}}]')
    assert (second.index, second.name) == (1, "get_time") and parser.finish() == []
    text = '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"ci'
    for step in (None, 1, 5):  # cut short by max_tokens: the unfinished call is content
        content, found = parse(ArrayParser(NAMES), text, step)
        assert calls(found) == [("get_time", {})] and content == '{"name": "get_weather", "arguments": {"ci'
    assert parse(ArrayParser(NAMES), "not an array") == ("not an array", [])


def test_named_streams_the_text_as_the_arguments():
    parser = NamedParser("get_weather")
    first, second = parser.feed('{"city": '), parser.feed('"Oslo"}')
    assert first[0].to_dict()["function"] == {"name": "get_weather", "arguments": '{"city": '}
    assert second[0].to_dict() == {"index": 0, "function": {"arguments": '"Oslo"}'}}
    assert parse(NamedParser("get_weather"), '{"city": "Oslo"}', 2)[1][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }


def output(text: str, reason: str | None = None) -> RequestOutput:
    if reason is None:
        return RequestOutput("r", [1], text, False)
    return RequestOutput("r", [1], text, True, reason, 5, 2, 0)


CALL_TEXT = ["Sure.<tool_", 'call>{"name": "get_time", ', '"arguments": {}}</tool_call>']


def test_a_streamed_call_is_one_delta_in_openais_shape_then_finish_reason_tool_calls():
    parts = [output(t) for t in CALL_TEXT[:-1]] + [output(CALL_TEXT[-1], "stop")]
    group = ReplayedGroup([(0, o) for o in parts], n=1)
    raw = events(
        group, Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1, parser=lambda: MarkupParser(NAMES)), False
    )
    choices = [json.loads(e[len("data: ") :])["choices"][0] for e in raw[:-1]]
    assert len(choices) == 3 and choices[1]["delta"] == {
        "content": "Sure."
    }  # the held '<tool_' made no chunk
    [call] = choices[2]["delta"]["tool_calls"]
    function = {"name": "get_time", "arguments": "{}"}
    assert call == {"index": 0, "id": call["id"], "type": "function", "function": function}
    assert call["id"].startswith("call_")
    assert [c["finish_reason"] for c in choices] == [None, None, "tool_calls"]


def test_the_json_body_carries_the_calls_and_no_content_when_there_is_none():
    only_a_call = "\n<tool_" + CALL_TEXT[1] + CALL_TEXT[2] + "\n"
    group = ReplayedGroup([(0, output(only_a_call, "stop"))], n=1)
    reply = Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1, parser=lambda: MarkupParser(NAMES))
    [choice] = json.loads(asyncio.run(complete(group, reply)).body)["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": "{}"} and call["id"].startswith("call_")
    cut = ReplayedGroup([(0, output('[{"name": "get_time", "arguments": {}}, {"na', "length"))], n=1)
    reply = Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1, parser=lambda: ArrayParser(NAMES))
    [choice] = json.loads(asyncio.run(complete(cut, reply)).body)["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == '{"na'
    assert len(choice["message"]["tool_calls"]) == 1
