"""Structured outputs over HTTP with the `openai` client: response_format (json_object, json_schema),
vLLM's guided_* extras and structured_outputs object, streamed and not, greedy and sampled; every
malformed request a 400 naming its field; forced tokens counted in /metrics."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from tests.conftest import API_KEY

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}

# Every string has a maxLength and every number a range, so that even sampled outputs end well inside
# max_tokens.
SCHEMAS = {
    "nested object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "email": {"type": "string", "maxLength": 24},
                },
                "required": ["id", "email"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "array of enums": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"type": "string", "enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["colors"],
        "additionalProperties": False,
    },
    "enum and integer": {
        "type": "object",
        "properties": {
            "size": {"enum": ["S", "M", "L"]},
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["size", "count"],
        "additionalProperties": False,
    },
    "optional fields": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 20},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "rating": {"type": "integer", "minimum": 0, "maximum": 5},
        },
        "required": ["title"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": 0, "maximum": 9},
                "y": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    "nullable": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "null"}]},
            "unit": {"type": "string", "enum": ["cm", "kg"]},
        },
        "required": ["value", "unit"],
        "additionalProperties": False,
    },
}


def messages(ask: str) -> list[dict]:
    return [{"role": "user", "content": ask}]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_json_object_parses_streamed_and_not(client):
    body = {
        "model": MODEL,
        "messages": messages('Reply with a JSON object with the key "capital" for France.'),
        "response_format": {"type": "json_object"},
        "max_tokens": 48,
        "temperature": 0,
    }
    full = client.chat.completions.create(**body)
    assert full.choices[0].finish_reason == "stop", full.choices[0].message.content
    assert isinstance(json.loads(full.choices[0].message.content), dict)
    chunks = list(client.chat.completions.create(**body, stream=True))
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == full.choices[0].message.content
    )


def test_json_schema_outputs_validate_greedy_and_sampled(client):
    def one(case: tuple[dict, float, int]) -> tuple[str, str]:
        schema, temperature, seed = case
        r = client.chat.completions.create(
            model=MODEL,
            messages=messages(f"Reply in JSON that follows this schema: {json.dumps(schema)}"),
            response_format=schema_format(schema),
            max_tokens=120,
            temperature=temperature,
            seed=seed,
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    cases = [(s, t, i) for i, s in enumerate(SCHEMAS.values()) for t in (0.0, 1.0)]
    with ThreadPoolExecutor(6) as pool:  # the session server's 48-block pool holds about six of these
        results = list(pool.map(one, cases))
    for (name, schema), pair in zip(SCHEMAS.items(), zip(results[::2], results[1::2])):
        for text, reason in pair:
            assert reason == "stop", (name, text)
            jsonschema.validate(json.loads(text), schema)


def test_a_streamed_json_schema_answer_equals_the_plain_one(client):
    schema = SCHEMAS["enum and integer"]
    body = {
        "model": MODEL,
        "messages": messages("Pick a T-shirt size and a small count."),
        "response_format": schema_format(schema),
        "max_tokens": 40,
        "temperature": 0,
    }
    full = client.chat.completions.create(**body).choices[0].message.content
    chunks = list(client.chat.completions.create(**body, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    jsonschema.validate(json.loads(full), schema)


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_regex": r"[0-9]{3}-[0-9]{4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        ({"guided_choice": ["sunny", "rainy"]}, lambda t: t in ("sunny", "rainy")),
        (
            {"guided_grammar": 'root ::= "It is " ("hot" | "cold") "."'},
            lambda t: t in ("It is hot.", "It is cold."),
        ),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"regex": "[a-z]{2,5}"}}, lambda t: re.fullmatch("[a-z]{2,5}", t)),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_guided_regex_choice_and_grammar(client, extra, check, stream):
    r = client.completions.create(
        model=MODEL,
        prompt="The weather today:",
        max_tokens=24,
        temperature=0,
        stream=stream,
        extra_body=extra,
    )
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].text for c in chunks)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason][-1]
    else:
        text, reason = r.choices[0].text, r.choices[0].finish_reason
    assert reason == "stop" and check(text), text


def test_forced_tokens_change_nothing_and_are_counted(server, client):
    schema = SCHEMAS["nested object"]
    body = {
        "model": MODEL,
        "messages": messages("Make up a user account."),
        "response_format": schema_format(schema),
        "max_tokens": 60,
        "temperature": 0,
    }
    before = server.wait_idle()
    on = client.chat.completions.create(**body).choices[0].message.content
    middle = server.wait_idle()
    off = (
        client.chat.completions.create(**body, extra_body={"forced_tokens": False}).choices[0].message.content
    )
    after = server.wait_idle()
    assert on == off
    jsonschema.validate(json.loads(on), schema)
    forced = (
        middle["llmopt:spec_decode_num_forced_tokens_total"]
        - before["llmopt:spec_decode_num_forced_tokens_total"]
    )
    assert forced >= 6  # the keys, quotes and braces of {"user": {"id": .., "email": ".."}, "active": ..}
    assert (
        after["llmopt:spec_decode_num_forced_tokens_total"]
        == middle["llmopt:spec_decode_num_forced_tokens_total"]
    )
    assert (
        after["vllm:spec_decode_num_forced_tokens_total"]
        == after["llmopt:spec_decode_num_forced_tokens_total"]
    )


CHAT = {"messages": messages("hi"), "max_tokens": 4}
UNCOMPILABLE = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
BAD = [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": schema_format([1, 2])}, "response_format"),
    ({"response_format": schema_format(UNCOMPILABLE)}, "response_format"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_choice": ["a"], "forced_tokens": "no"}, "forced_tokens"),
    ({"guided_choice": ["a"], "min_tokens": 2}, "min_tokens"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_each_bad_structured_output_is_a_400_naming_its_field(server, extra, param):
    r = httpx.post(server.url + "/v1/chat/completions", headers=HEADERS, json={**CHAT, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


TAGS = {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True}
UNENFORCED = {"type": "object", "properties": {"tags": TAGS}, "required": ["tags"]}
NOT_FIVE = {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 5}}}}


@pytest.mark.parametrize(
    "extra, param, keyword, where",
    [
        (
            {"response_format": schema_format(UNENFORCED)},
            "response_format",
            "uniqueItems",
            "#/properties/tags",
        ),
        (  # strict false asks for no less
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": UNENFORCED, "strict": False},
                }
            },
            "response_format",
            "uniqueItems",
            "#/properties/tags",
        ),
        ({"guided_json": NOT_FIVE}, "guided_json", "not", "#/properties/n"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": NOT_FIVE}}],
                "tool_choice": "required",
            },
            "tools",
            "not",
            "/properties/n",
        ),
    ],
)
def test_a_keyword_xgrammar_would_ignore_is_a_400_naming_it_and_its_path(
    server, extra, param, keyword, where
):
    r = httpx.post(server.url + "/v1/chat/completions", headers=HEADERS, json={**CHAT, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"'{keyword}'" in error["message"], error
    assert f"{where}/{keyword}" in error["message"], error


def test_a_bad_guided_field_on_completions_is_a_400_too(server):
    body = {"prompt": "hi", "max_tokens": 4, "guided_regex": "[z-a]"}
    r = httpx.post(server.url + "/v1/completions", headers=HEADERS, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex", r.text
