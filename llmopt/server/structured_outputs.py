"""Which structured output a request asks for — OpenAI's `response_format`, vLLM's `guided_json` /
`guided_regex` / `guided_choice` / `guided_grammar` extras or its newer `structured_outputs` object —
and its compilation before the request enters the engine. A malformed one, or one xgrammar cannot
compile, is a 400 naming its field."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.structured.compiler import COMPILE_TIMEOUT_S
from llmopt.engine.structured.request import StructuredOutput
from llmopt.server.error_bodies import APIError
from llmopt.server.protocol import SamplingRequest

MAX_SPEC_CHARS = 100_000  # a schema, regex or grammar; its compile time grows with it
MAX_CHOICES = 1024
MAX_SCHEMA_DEPTH = 64  # xgrammar converts a schema recursively, in native code
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
GUIDED_FIELDS = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
STRUCTURED_OUTPUTS_KEYS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
}


@dataclass(frozen=True)
class RequestedOutput:
    output: StructuredOutput
    param: str  # the request field it came from, which its errors name


def structured_output(req: SamplingRequest) -> StructuredOutput | None:
    """The structured output `req` asks for; None for free text."""
    requested = requested_output(req)
    return None if requested is None else requested.output


def requested_output(req: SamplingRequest) -> RequestedOutput | None:
    """The structured output `req` asks for and the field that asked; two ways of asking is a 400."""
    extra = req.model_extra or {}
    found: list[RequestedOutput] = []
    if extra.get("response_format") is not None:
        output = from_response_format(extra["response_format"])
        if output is not None:
            found.append(RequestedOutput(output, "response_format"))
    for name, kind in GUIDED_FIELDS.items():
        if extra.get(name) is not None:
            found.append(RequestedOutput(from_value(kind, extra[name], name), name))
    if extra.get("structured_outputs") is not None:
        found.append(from_structured_outputs(extra["structured_outputs"]))
    if len(found) > 1:
        names = " and ".join(f.param for f in found)
        raise APIError(400, f"ask for one structured output, not {names}", param=found[1].param)
    return found[0] if found else None


def from_response_format(value: object) -> StructuredOutput | None:
    param = "response_format"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise APIError(400, 'response_format must be an object with a "type"', param=param)
    kind = value["type"]
    if kind not in RESPONSE_FORMAT_TYPES:
        raise APIError(
            400,
            f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, not {kind!r}",
            param=param,
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise APIError(400, 'response_format.json_schema must be an object with a "schema"', param=param)
    return from_value("json_schema", spec["schema"], param)


def from_structured_outputs(value: object) -> RequestedOutput:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise APIError(400, "structured_outputs must be an object", param=param)
    if value.get("structural_tag") is not None:
        raise APIError(400, "structured_outputs.structural_tag is not supported by this server", param=param)
    asked = [key for key in STRUCTURED_OUTPUTS_KEYS if value.get(key) is not None and value[key] is not False]
    if len(asked) != 1:
        keys = ", ".join(STRUCTURED_OUTPUTS_KEYS)
        raise APIError(400, f"structured_outputs needs exactly one of {keys}", param=param)
    key = asked[0]
    return RequestedOutput(from_value(STRUCTURED_OUTPUTS_KEYS[key], value[key], param), param)


def from_value(kind: str, value: object, param: str) -> StructuredOutput:
    """The StructuredOutput of one field's value (a schema, a regex, a list of choices, a grammar)."""
    if kind == "json_schema":
        try:
            output = StructuredOutput.json_schema(schema_object(value, param))
        except ValueError as exc:  # a keyword xgrammar would not enforce
            raise APIError(400, f"{param}: {exc}", param=param) from None
    elif kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise APIError(
                400, f"{param}: the choices must be a non-empty list of non-empty strings", param=param
            )
        if len(value) > MAX_CHOICES:
            raise APIError(400, f"{param}: at most {MAX_CHOICES} choices", param=param)
        output = StructuredOutput.choice(value)
    elif kind == "json_object":
        if value is not True:
            raise APIError(400, f"{param}: json_object must be true", param=param)
        output = StructuredOutput("json_object")
    else:
        if not isinstance(value, str) or not value:
            raise APIError(400, f"{param}: the {kind} must be a non-empty string", param=param)
        output = StructuredOutput(kind, value)  # type: ignore[arg-type]
    if len(output.spec) > MAX_SPEC_CHARS:
        raise APIError(400, f"{param}: the {kind} may be at most {MAX_SPEC_CHARS} characters", param=param)
    return output


def schema_object(value: object, param: str) -> dict:
    """A JSON schema given as an object or as JSON text; it must be an object, and not nested deeper
    than MAX_SCHEMA_DEPTH."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"{param}: the schema is not valid JSON ({exc.msg})", param=param) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{param}: the schema must be a JSON object", param=param)
    level, depth = [value], 0
    while level:  # breadth first: a recursive walk would hit Python's own recursion limit first
        depth += 1
        if depth > MAX_SCHEMA_DEPTH:
            raise APIError(400, f"{param}: the schema is nested deeper than {MAX_SCHEMA_DEPTH}", param=param)
        children = (v.values() if isinstance(v, dict) else v for v in level)
        level = [c for group in children for c in group if isinstance(c, dict | list)]
    return value


def forced_tokens(req: SamplingRequest) -> bool:
    """The `forced_tokens` extra field: false stops proposing the tokens a grammar forces (the
    benchmark's baseline); the output is the same either way."""
    value = (req.model_extra or {}).get("forced_tokens", True)
    if not isinstance(value, bool):
        raise APIError(400, "forced_tokens must be true or false", param="forced_tokens")
    return value


async def compile_output(engine: LLMEngine, output: StructuredOutput, param: str) -> StructuredOutput:
    """Compile `output` (or find it in the engine's cache) on a grammar thread, off the event loop and
    the engine thread, so that the engine finds it compiled; a grammar xgrammar refuses, or one that
    takes over COMPILE_TIMEOUT_S (waiting for a grammar thread included), is a 400 naming `param`."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(engine.grammars.submit(output)), COMPILE_TIMEOUT_S)
    except asyncio.TimeoutError:
        message = f"{param}: compiling the {output.kind} took over {COMPILE_TIMEOUT_S:.0f} s"
        raise APIError(400, message, param=param) from None
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from None
    return output


async def requested_and_compiled(engine: LLMEngine, req: SamplingRequest) -> StructuredOutput | None:
    """What `req` asks for, compiled; None for free text."""
    requested = requested_output(req)
    if requested is None:
        return None
    return await compile_output(engine, requested.output, requested.param)
