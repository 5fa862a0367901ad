"""What a chat request's `tools` and `tool_choice` ask for (checked: each bad value is a 400 naming it),
how tools and earlier calls reach the prompt, and the JSON schema that constrains a call.

A chat template that renders `tools` itself gets them (and the conversation's calls and results) as
transformers' apply_chat_template takes them. Otherwise (SmolLM2's template, for one) tools are written
into the system message in one Hermes-style format, the one Qwen's templates use: the signatures between
<tools> and </tools>, one JSON object a line, and each call asked for as
<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Earlier assistant calls are replayed in that
markup and tool results go back as <tool_response> blocks in a user turn (consecutive results in one),
so an agent loop's history reads as the model was asked to write it and any template accepts it."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Literal

from llmopt.engine.structured.request import StructuredOutput
from llmopt.server.error_bodies import APIError
from llmopt.server.protocol import ChatMessage, FunctionDefinition, NamedToolChoice, ToolDefinition
from llmopt.server.structured_outputs import schema_object
from llmopt.server.tool_parsers import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ArrayParser,
    ChoiceParser,
    MarkupParser,
    NamedParser,
)

NO_ARGUMENTS = {"type": "object", "properties": {}}
TOOLS_PROMPT = """# Tools

You may call functions to answer. Their signatures are between <tools> and </tools>, one a line:
<tools>
{signatures}
</tools>

To call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>
{how_many}"""
PARALLEL = "Write one such block for each call you make."
ONE_CALL = "Call at most one function in an answer."
# A template that uses a `tools` variable in a Jinja block renders tools itself.
TEMPLATE_USES_TOOLS = re.compile(r"\{[{%][^}]*\btools\b")


@dataclass(frozen=True)
class ToolChoice:
    """A chat request's tools and what it asks of them, checked."""

    functions: dict[str, FunctionDefinition]  # by name, in the request's order
    mode: Literal["none", "auto", "required", "named"]
    named: str | None = None  # the function tool_choice names
    parallel: bool = True

    @classmethod
    def of(
        cls,
        tools: list[ToolDefinition] | None,
        choice: str | NamedToolChoice | None = None,
        parallel: bool = True,
    ) -> ToolChoice | None:
        """None when the request has no tools (then tool_choice may only ask for none or auto)."""
        functions = checked_functions(tools or [])
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in functions:
                known = ", ".join(functions) or "none: the request has no tools"
                raise APIError(
                    400,
                    f"tool_choice names the function {name!r}, not among tools ({known})",
                    param="tool_choice",
                )
            return cls(functions, "named", name, parallel)
        if choice == "required" and not functions:
            raise APIError(400, "tool_choice 'required' needs tools to call", param="tool_choice")
        return cls(functions, choice or "auto", None, parallel) if functions else None

    def system_prompt(self) -> str:
        signatures = "\n".join(
            json.dumps(template_tool(f), ensure_ascii=False) for f in self.functions.values()
        )
        return TOOLS_PROMPT.format(signatures=signatures, how_many=PARALLEL if self.parallel else ONE_CALL)

    def template_tools(self) -> list[dict]:
        """The tools as a chat template that renders them takes them."""
        return [template_tool(f) for f in self.functions.values()]

    def constraint(self) -> dict | None:
        """The JSON schema the output must follow: an array of calls (required) or one function's
        arguments (named); None where the text is free (auto, none)."""
        if self.mode == "named":
            assert self.named is not None
            return arguments_schema(self.functions[self.named])
        if self.mode == "required":
            return calls_schema(list(self.functions.values()), self.parallel)
        return None

    def parser(self) -> ChoiceParser | None:
        """A fresh parser for one choice's text; None where calls are not read (none)."""
        names = frozenset(self.functions)
        if self.mode == "auto":
            return MarkupParser(names, self.parallel)
        if self.mode == "required":
            return ArrayParser(names)
        if self.mode == "named":
            assert self.named is not None
            return NamedParser(self.named)
        return None


def checked_functions(tools: list[ToolDefinition]) -> dict[str, FunctionDefinition]:
    """The tools' functions by name; a duplicate name or parameters that are no object schema is a 400."""
    functions: dict[str, FunctionDefinition] = {}
    for i, tool in enumerate(tools):
        function = tool.function
        if function.name in functions:
            raise APIError(400, f"tools[{i}]: a second function named {function.name!r}", param="tools")
        params = function.parameters
        if params is not None and (
            params.get("type", "object") != "object"
            or not isinstance(params.get("properties", {}), dict)
            or not isinstance(params.get("$defs", {}), dict)
        ):
            raise APIError(
                400,
                f"tools[{i}].function.parameters must be a JSON schema of type object "
                "(with properties and $defs, if given, objects)",
                param="tools",
            )
        if params is not None:  # bounded as any schema a grammar is compiled from
            schema_object(params, "tools")
        functions[function.name] = function
    return functions


def template_tool(function: FunctionDefinition) -> dict:
    return {"type": "function", "function": function.model_dump(exclude_none=True, exclude={"strict"})}


def arguments_schema(function: FunctionDefinition) -> dict:
    """A function's parameters as the schema of its arguments: an object (the type said if left out)."""
    return {"type": "object", **(function.parameters or NO_ARGUMENTS)}


def calls_schema(functions: list[FunctionDefinition], parallel: bool) -> dict:
    """A JSON array (one element at most without parallel calls) of {"name", "arguments"} objects, each
    naming one function and holding arguments that follow its parameters. Each function's `$defs` move
    to the root, where their `#/$defs/...` references now point."""
    defs: dict = {}
    variants = []
    for function in functions:
        params = arguments_schema(function)
        for key, value in params.pop("$defs", {}).items():
            if defs.setdefault(key, value) != value:
                raise APIError(
                    400, f"tools define $defs {key!r} differently: a required call needs one", param="tools"
                )
        properties = {"name": {"type": "string", "enum": [function.name]}, "arguments": params}
        variants.append(
            {
                "type": "object",
                "properties": properties,
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def constrained_output(
    requested: StructuredOutput | None, tools: ToolChoice | None
) -> StructuredOutput | None:
    """What constrains the output: the tool call's schema (required, named), else what the request's
    response_format or guided_* asked for; both at once is a 400, since only one can hold."""
    schema = tools.constraint() if tools is not None else None
    if schema is None:
        return requested
    if requested is not None:
        raise APIError(
            400,
            "response_format (or guided_*) cannot be combined with tool_choice 'required' or a named "
            "function: the tool call's schema constrains the output",
            param="response_format",
        )
    try:
        return StructuredOutput.json_schema(schema)
    except ValueError as exc:  # a keyword xgrammar would not enforce, in a tool's parameters
        raise APIError(400, f"tools: {exc}", param="tools") from None


def template_handles_tools(chat_template: object) -> bool:
    """Whether the tokenizer's chat template renders `tools` (a template per name, as a dict: no)."""
    return isinstance(chat_template, str) and _uses_tools(chat_template)


@functools.lru_cache(maxsize=8)  # asked on every chat request, of the same template
def _uses_tools(chat_template: str) -> bool:
    return TEMPLATE_USES_TOOLS.search(chat_template) is not None


def template_messages(messages: list[ChatMessage], tools: ToolChoice | None, native: bool) -> list[dict]:
    """The conversation as the chat template takes it: with calls and results as the template renders
    them (native) or in this module's markup, and the tools prompt in the system message."""
    if native:
        return [native_message(m, i) for i, m in enumerate(messages)]
    rendered: list[dict] = []
    for i, m in enumerate(messages):
        if m.role != "tool":
            rendered.append({"role": m.role, "content": with_calls(m, i)})
        elif i > 0 and messages[i - 1].role == "tool":
            rendered[-1]["content"] += "\n" + tool_response(m)
        else:
            rendered.append({"role": "user", "content": tool_response(m)})
    return with_system_prompt(rendered, tools.system_prompt()) if tools is not None else rendered


def with_system_prompt(messages: list[dict], prompt: str) -> list[dict]:
    """The tools prompt after the client's own system message, or as the system message."""
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        content = f"{first['content']}\n\n{prompt}" if first["content"] else prompt
        return [{**first, "content": content}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def tool_response(message: ChatMessage) -> str:
    return f"<tool_response>\n{message.text()}\n</tool_response>"


def with_calls(message: ChatMessage, index: int) -> str:
    """A message's text, then its tool calls in the markup the model was asked to write."""
    calls = [
        f"{TOOL_CALL_OPEN}\n"
        + json.dumps({"name": c.function.name, "arguments": arguments(message, index, j)}, ensure_ascii=False)
        + f"\n{TOOL_CALL_CLOSE}"
        for j, c in enumerate(message.tool_calls or [])
    ]
    return "\n".join([message.text(), *calls] if message.text() else calls)


def native_message(message: ChatMessage, index: int) -> dict:
    """A message as transformers' chat templates take one: calls with their arguments as objects."""
    rendered: dict = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": arguments(message, index, j)},
            }
            for j, c in enumerate(message.tool_calls)
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def arguments(message: ChatMessage, index: int, call: int) -> object:
    """A replayed call's arguments, parsed: text that is no JSON is a 400."""
    assert message.tool_calls is not None
    text = message.tool_calls[call].function.arguments
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise APIError(
            400,
            f"messages[{index}].tool_calls[{call}].function.arguments must be a JSON string, "
            f"got {text[:80]!r}",
            param="messages",
        ) from None
