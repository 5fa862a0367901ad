"""The JSON-schema keywords xgrammar compiles but does not enforce: each refused one is shown to be
dropped by xgrammar (its grammar admits a value the keyword forbids: if an upgrade starts enforcing it,
the refusal can go), each allowed look-alike is shown to be enforced, and the walk names the keyword
and its JSON pointer without reading data (property names, enum values) as keywords. Model-free."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from llmopt.engine.structured.request import StructuredOutput
from llmopt.engine.structured.schema_support import unenforced_keyword

INT = {"type": "integer"}
# (schema, a value the schema forbids, the keyword refused)
DROPPED = [
    ({"type": "number", "multipleOf": 0.5}, "0.3", "multipleOf"),
    ({"type": "integer", "multipleOf": 3, "minimum": 10}, "13", "multipleOf"),
    ({"type": "array", "items": INT, "uniqueItems": True}, "[1, 1]", "uniqueItems"),
    ({"type": "array", "items": INT, "contains": {"const": 5}}, "[1]", "contains"),
    ({"type": "string", "format": "idn-email"}, '"~ ~"', "format"),
    ({"type": "integer", "not": {"const": 3}}, "3", "not"),
    (
        {
            "type": "object",
            "properties": {"a": INT},
            "if": {"properties": {"a": {"const": 1}}},
            "then": {"required": ["b"]},
        },
        '{"a": 1}',
        "if",
    ),
    (
        {"type": "object", "properties": {"a": INT, "b": INT}, "dependentRequired": {"a": ["b"]}},
        '{"a": 1}',
        "dependentRequired",
    ),
    (
        {"type": "object", "properties": {"a": INT, "b": INT}, "dependencies": {"a": ["b"]}},
        '{"a": 1}',
        "dependencies",
    ),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 2}, '"abcdef"', "maxLength"),
    ({"type": "string", "format": "email", "minLength": 30}, '"a@b.co"', "minLength"),
    (
        {"allOf": [{"type": "object", "properties": {"a": INT}, "required": ["a"]}, {"required": ["b"]}]},
        '{"a": 1}',
        "allOf",
    ),
    ({"$defs": {"i": INT}, "$ref": "#/$defs/i", "minimum": 5}, "3", "minimum"),
    ({"type": "object", "properties": {"a": INT}, "required": ["b"]}, '{"a": 1}', "required"),
]  # fmt: skip
# Look-alikes xgrammar does enforce: (schema, a value it forbids)
ENFORCED = [
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": "array", "items": INT, "uniqueItems": False, "maxItems": 1}, "[1, 1]"),
    ({"type": "string", "format": "date"}, '"~ ~"'),
    ({"type": "string", "pattern": "^[a-z]+$"}, '"AB"'),
    ({"type": "string", "minLength": 3}, '"a"'),
    ({"type": "object", "patternProperties": {"^a": INT}}, '{"ab": "x"}'),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, '{"abcd": 1}'),
    ({"allOf": [{"$ref": "#/$defs/i"}], "$defs": {"i": {"type": "integer", "minimum": 5}}}, "3"),
    ({"$defs": {"i": {"type": "integer", "minimum": 5}}, "$ref": "#/$defs/i", "description": "x"}, "3"),
    ({"type": "object", "properties": {"a": INT}, "unevaluatedProperties": False}, '{"a": 1, "b": 2}'),
]


def admits(schema: dict, text: str) -> bool:
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    return _is_grammar_accept_string(grammar, text)


@pytest.mark.parametrize("schema, forbidden, keyword", DROPPED)
def test_each_refused_keyword_is_one_xgrammar_drops(schema, forbidden, keyword):
    assert admits(schema, forbidden), "xgrammar enforces this now: the refusal can go"
    found = unenforced_keyword(schema)
    assert found is not None and found[0] == keyword and found[1] == f"#/{keyword}"


@pytest.mark.parametrize("schema, forbidden", ENFORCED)
def test_what_xgrammar_enforces_is_let_through(schema, forbidden):
    assert not admits(schema, forbidden)
    assert unenforced_keyword(schema) is None


def test_the_walk_names_the_json_pointer_and_reads_no_data_as_keywords():
    nested = {
        "type": "object",
        "properties": {
            "not": {"type": "string", "enum": ["if", "then"], "default": {"uniqueItems": True}},
            "a/b": {"type": "array", "items": {"anyOf": [INT, {"type": "array", "uniqueItems": True}]}},
        },
    }
    assert unenforced_keyword(nested) == ("uniqueItems", "#/properties/a~1b/items/anyOf/1/uniqueItems")
    assert unenforced_keyword({"$defs": {"x": {"not": {}}}, "type": "integer"}) == ("not", "#/$defs/x/not")
    assert unenforced_keyword({"$ref": "https://example.com/s.json"}) == ("$ref", "#/$ref")
    fine = {"type": "object", "properties": {"not": INT, "if": {"type": "string", "const": "not"}}}
    assert unenforced_keyword(fine) is None


def test_a_schema_is_checked_where_its_one_text_form_is_made():
    """StructuredOutput.json_schema refuses while the schema is a dict, so no later step parses its text
    again to check it (xgrammar alone reads the text)."""
    with pytest.raises(ValueError, match=r"'uniqueItems' \(at #/uniqueItems\), which xgrammar does not"):
        StructuredOutput.json_schema({"type": "array", "items": INT, "uniqueItems": True})
    fine = StructuredOutput.json_schema({"type": "integer", "minimum": 1})
    assert fine.spec == '{"type": "integer", "minimum": 1}'
