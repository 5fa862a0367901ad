"""Tools through the official `openai` client against the live server, streamed and not: required and
named calls constrained by their schema, auto reading the model's markup, an agent loop replaying calls
and results, a template that renders tools itself getting them as transformers takes them, and each
bad tools field a 400 naming it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import jsonschema
import pytest
from transformers import AutoTokenizer

from llmopt.server.error_bodies import APIError
from llmopt.server.protocol import ChatCompletionRequest
from llmopt.server.routes import Routes
from llmopt.server.settings import ServerSettings
from llmopt.server.tools import ToolChoice, template_handles_tools, template_messages
from tests.conftest import API_KEY

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
# Bounded strings, so that a greedy call always closes within the few tokens the tests allow.
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 16}},
    "required": ["timezone"],
}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a timezone.", "parameters": TIME_PARAMS},
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULTS = {"get_weather": '{"temperature": 18, "sky": "clear"}', "get_time": '{"time": "14:05"}'}


def ask(client, stream: bool, **kwargs) -> tuple[str | None, list[dict], str | None]:
    """(content, calls as {"id", "name", "arguments"}, finish reason) of choice 0, as a client puts a
    stream's deltas together or reads the JSON body."""
    args = {"model": MODEL, "messages": ASK, "tools": TOOLS, "temperature": 0, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        found = choice.message.tool_calls or []
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in found]
        return choice.message.content, calls, choice.finish_reason
    content, by_index, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = by_index.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    return content or None, [by_index[i] for i in sorted(by_index)], finish


def check_call(call: dict) -> None:
    assert call["id"].startswith("call_") and call["name"] in SCHEMAS, call
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def without_ids(calls: list[dict]) -> list[tuple[str, str]]:
    return [(c["name"], c["arguments"]) for c in calls]


def test_required_makes_one_call_whose_arguments_follow_its_schema(client):
    answers = [
        ask(client, stream, tool_choice="required", parallel_tool_calls=False, max_tokens=60)
        for stream in (False, True)
    ]
    for content, calls, finish in answers:
        assert finish == "tool_calls" and content is None
        [call] = calls
        check_call(call)
    assert without_ids(answers[0][1]) == without_ids(answers[1][1])  # greedy: the stream says the same


def test_required_with_parallel_calls_makes_only_valid_calls(client):
    for stream in (False, True):
        _, calls, finish = ask(client, stream, tool_choice="required", max_tokens=90)
        assert calls and finish in ("tool_calls", "length")
        for call in calls:
            check_call(call)


def test_a_named_function_is_called_with_valid_arguments(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    answers = [ask(client, stream, tool_choice=named, max_tokens=40) for stream in (False, True)]
    for content, calls, finish in answers:
        assert finish == "tool_calls" and content is None
        [call] = calls
        assert call["name"] == "get_time"
        check_call(call)
    assert without_ids(answers[0][1]) == without_ids(answers[1][1])


def test_auto_reads_the_markup_the_model_writes(client):
    # The model is held to the markup by a regex (the city is its own pick), so that the parse, not
    # the small model's willingness to call, is what is tested.
    markup = (
        '<tool_call>\n\\{"name": "get_weather", "arguments": '
        '\\{"city": "[A-Z][a-z]{1,10}", "unit": "celsius"\\}\\}\n</tool_call>'
    )
    answers = [
        ask(client, stream, max_tokens=60, extra_body={"guided_regex": markup}) for stream in (False, True)
    ]
    for content, calls, finish in answers:
        assert finish == "tool_calls" and content is None
        [call] = calls
        assert call["name"] == "get_weather"
        check_call(call)
    assert without_ids(answers[0][1]) == without_ids(answers[1][1])
    # A plain answer under auto is content, unchanged.
    content, calls, _ = ask(
        client, False, max_tokens=8, tool_choice="auto", messages=[{"role": "user", "content": "Say hi."}]
    )
    plain = ask(
        client, False, max_tokens=8, tool_choice="none", messages=[{"role": "user", "content": "Say hi."}]
    )
    assert calls == [] and content == plain[0]


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, headers=HEADERS, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_three_turn_agent_loop_replays_calls_and_results(server, client):
    messages = [{"role": "user", "content": "What is the weather in Paris, and the time there?"}]
    for _ in range(2):  # two turns of calls and their results
        content, calls, finish = ask(
            client, False, messages=messages, tool_choice="required", parallel_tool_calls=False, max_tokens=60
        )
        assert finish == "tool_calls" and len(calls) == 1
        check_call(calls[0])
        replayed = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
        messages.append({"role": "assistant", "content": content, "tool_calls": replayed})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": RESULTS[c["name"]]} for c in calls]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason in ("stop", "length")
    # The prompt holds every replayed call in the markup the model was asked for, and every result.
    tokenized = post(server, "/tokenize", {"messages": messages, "tools": TOOLS})
    assert tokenized["count"] == final.usage.prompt_tokens  # /tokenize renders as the chat route does
    prompt = post(server, "/detokenize", {"tokens": tokenized["tokens"]})["prompt"]
    assert prompt.count("\n<tools>\n") == 1 and '"name": "get_weather"' in prompt
    for message in messages:
        for call in message.get("tool_calls", []):
            function = call["function"]
            markup = json.dumps({"name": function["name"], "arguments": json.loads(function["arguments"])})
            assert f"<tool_call>\n{markup}\n</tool_call>" in prompt
        if message["role"] == "tool":
            assert f"<|im_start|>user\n<tool_response>\n{message['content']}\n</tool_response>" in prompt


CHAT = "/v1/chat/completions"
NAMED = {"type": "function", "function": {"name": "get_news"}}
UNCOMPILABLE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}
REPLAYED_BADLY = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{tz"}}],
    },
]
BAD_TOOLS = [
    (CHAT, {"tools": TOOLS, "tool_choice": NAMED}, "tool_choice"),  # names no declared function
    (CHAT, {"tool_choice": "required"}, "tool_choice"),  # no tools to call
    (CHAT, {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    (CHAT, {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    (CHAT, {"tools": [{"type": "retrieval", "function": TOOLS[0]["function"]}]}, "tools"),
    (
        CHAT,
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
        "tools",
    ),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    (CHAT, {"tools": [TOOLS[0], TOOLS[0]]}, "tools"),  # the same name twice
    (CHAT, {"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools"),
    (CHAT, {"tools": TOOLS, "messages": REPLAYED_BADLY}, "messages"),  # arguments that are no JSON
    (
        CHAT,
        {
            "messages": [
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}
            ]
        },
        "messages",
    ),  # arguments not a string
    (
        CHAT,
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
    ),
    (  # a schema the grammar compiler refuses, named by the field it came from
        CHAT,
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": UNCOMPILABLE}}],
            "tool_choice": "required",
        },
        "tools",
    ),
    ("/v1/completions", {"prompt": "hi", "tools": TOOLS}, "tools"),  # completions have no tools
]


@pytest.mark.parametrize("path, body, param", BAD_TOOLS)
def test_bad_tools_are_a_400_naming_the_field(server, path, body, param):
    full = {"max_tokens": 2, **({"messages": ASK} if path == CHAT else {}), **body}
    r = httpx.post(server.url + path, headers=HEADERS, json=full, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


QWEN_LIKE_TEMPLATE = """{%- if tools %}<|im_start|>system
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}{% for call in m.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}"""


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_objects(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = QWEN_LIKE_TEMPLATE
    assert template_handles_tools(tokenizer.chat_template)
    function = {"name": "get_time", "arguments": '{"timezone": "UTC"}'}
    call = {"id": "c1", "type": "function", "function": function}
    req = ChatCompletionRequest(
        messages=[*ASK, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "noon"}],
        tools=TOOLS,
    )
    tools = ToolChoice.of(req.tools, req.tool_choice)
    text = tokenizer.apply_chat_template(
        template_messages(req.messages, tools, native=True), tools=tools.template_tools(), tokenize=False
    )
    assert [json.loads(line) for line in text.splitlines()[1:3]] == TOOLS
    assert '<tool_call>{"name": "get_time", "arguments": {"timezone": "UTC"}}</tool_call>' in text
    assert "<|im_start|>tool\nnoon<|im_end|>" in text and "# Tools" not in text  # no prompt of our own


def test_a_model_without_a_chat_template_answers_chat_with_a_400_pointing_at_completions():
    base_model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None))
    routes = Routes(base_model, None, None, ServerSettings("base", None, 4 * 2**20), None)
    req = ChatCompletionRequest(messages=ASK)
    with pytest.raises(APIError) as error:
        routes.chat_prompt(req.messages, None)
    assert error.value.status == 400 and error.value.param == "messages"
    assert "'base' has no chat template" in error.value.message and "/v1/completions" in error.value.message
