"""JSON-schema keywords xgrammar 0.2.9 compiles but does not enforce. Its converter drops them without a
word, so an answer "valid by construction" could break the schema; a schema that uses one is refused
instead, naming the keyword and where it is (vLLM's xgrammar backend refuses the same features in
`has_xgrammar_unsupported_json_features`). Found by compiling a schema with each keyword and checking
that the grammar admits a value the keyword forbids; tests/engine/test_schema_support.py keeps that
check, so an xgrammar upgrade that starts enforcing one shows here.

Not refused: `oneOf` is read as `anyOf` (a value matching two branches passes; unions that a
discriminator or disjoint types keep apart, as Pydantic writes them, are exact); annotations
(`description`, `contentEncoding`, ...) assert nothing."""

from __future__ import annotations

from collections.abc import Iterator

# Formats xgrammar writes a grammar for (cpp/json_schema_converter.cc); any other is ignored.
ENFORCED_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
# Ignored wherever they are.
IGNORED_KEYWORDS = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
)
# Keywords beside a $ref that assert nothing (the rest are dropped: only the target is compiled).
REF_SIBLINGS_KEPT = frozenset(
    {"$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "default"}
    | {"examples", "deprecated", "readOnly", "writeOnly"}
)
# Where subschemas sit: a schema under each name of a map, one schema, or a list of schemas.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
)
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def unenforced_keyword(schema: object) -> tuple[str, str] | None:
    """(keyword, JSON pointer to it) of the first keyword xgrammar would not enforce; None if none."""
    for path, node in subschemas(schema, "#"):
        found = _unenforced_here(node)
        if found is not None:
            return found, f"{path}/{found}"
    return None


def subschemas(schema: object, path: str) -> Iterator[tuple[str, dict]]:
    """Every schema object in `schema` with its JSON pointer, itself first; property names and values
    of enum, const or default are data, never read as keywords. Iterative: the depth is the client's."""
    stack = [(path, schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        children: list[tuple[str, object]] = []
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                children += [(f"{path}/{key}/{escape(name)}", sub) for name, sub in node[key].items()]
        for key in SCHEMA_VALUES:
            if key in node:
                children.append((f"{path}/{key}", node[key]))
        for key in SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                children += [(f"{path}/{key}/{i}", sub) for i, sub in enumerate(node[key])]
        stack.extend(reversed(children))  # depth first, in the schema's order


def _unenforced_here(node: dict) -> str | None:
    """The first keyword of this schema object (not its subschemas) that xgrammar drops."""
    for key in IGNORED_KEYWORDS:
        if key in node:
            return key
    if node.get("uniqueItems") is True:
        return "uniqueItems"
    if "format" in node and node["format"] not in ENFORCED_FORMATS:
        return "format"
    if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
        # The pattern's (or format's) grammar is used alone; the length bound is dropped.
        return "minLength" if "minLength" in node else "maxLength"
    if "multipleOf" in node and not _enforced_multiple(node):
        return "multipleOf"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "allOf"  # only one subschema is kept, not their intersection
    if "$ref" in node:
        if not (isinstance(node["$ref"], str) and node["$ref"].startswith("#")):
            return "$ref"  # a remote schema is not fetched
        return next((key for key in node if key not in REF_SIBLINGS_KEPT), None)
    return _unlisted_required(node)


def _enforced_multiple(node: dict) -> bool:
    """multipleOf holds only on a bare integer with an integer step: beside a range it is dropped."""
    ranged = any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
    step = node["multipleOf"]
    integral = isinstance(step, int) and not isinstance(step, bool)
    return node.get("type") == "integer" and integral and not ranged


def _unlisted_required(node: dict) -> str | None:
    """A required name that `properties` does not define is not required by the grammar."""
    required, properties = node.get("required"), node.get("properties")
    if isinstance(required, list) and required:
        defined = properties if isinstance(properties, dict) else {}
        if any(name not in defined for name in required):
            return "required"
    return None


def escape(name: str) -> str:
    """A property name as a JSON pointer segment (RFC 6901)."""
    return str(name).replace("~", "~0").replace("/", "~1")
