"""Whether a structured answer is what its request asked for: a request's `response_format` (OpenAI's
json_schema or json_object) against the text the server sent and its finish_reason.

An answer cut by max_tokens (finish_reason "length") is "truncated" whatever its text: a strict schema's
grammar can only end at a complete document, so a cut answer is never valid output, even where its
prefix happens to parse. The rest are "valid" when the text parses as JSON and, for a json_schema, the
document is of the schema (jsonschema's check); else "invalid"."""

from __future__ import annotations

import json

import jsonschema

OUTCOMES = ("valid", "truncated", "invalid")


def structured_outcome(response_format: dict, text: str | None, finish_reason: str | None) -> str:
    if finish_reason == "length":
        return "truncated"
    try:
        document = json.loads(text or "")
    except ValueError:
        return "invalid"
    schema = (response_format.get("json_schema") or {}).get("schema")
    if response_format.get("type") != "json_schema" or not isinstance(schema, dict):
        return "valid"  # json_object: any JSON document
    try:
        jsonschema.validate(document, schema)
    except (jsonschema.ValidationError, jsonschema.SchemaError):
        return "invalid"
    return "valid"
