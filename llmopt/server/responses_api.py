"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), translated at
the edge into the one internal chat request (chat_call.py): `instructions` and the `input` items become
chat messages (`function_call` items an assistant's tool calls, `function_call_output` items tool
results, `reasoning` items dropped: this server's models write none), the flat function tools chat's
tools, `text.format` the structured output, `max_output_tokens` chat's max_tokens. The answer is written
back as output items by responses_events.py. With `previous_response_id` the conversation is the stored
response's items followed by the new input (response_store.py), so a chained turn sends only what is
new and the prefix cache serves the rest."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmopt.server.auth import owner_of
from llmopt.server.chat_call import ChatCall
from llmopt.server.error_bodies import APIError
from llmopt.server.protocol import (
    MAX_TOOLS,
    TOOL_NAME_PATTERN,
    ChatCompletionRequest,
    ChatMessage,
    FunctionDefinition,
    MessageToolCall,
    NamedFunction,
    NamedToolChoice,
    ToolCallFunction,
    ToolDefinition,
)
from llmopt.server.response_store import ResponseStore, StoredResponse
from llmopt.server.responses_events import ResponseFrame, response_body, response_events
from llmopt.server.structured_outputs import RequestedOutput, from_value

if TYPE_CHECKING:
    from llmopt.server.routes import Routes

# Chat's fields in the Responses API's words, for the errors the shared path raises.
FIELD_NAMES = {
    "messages": "input",
    "prompt": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text",
}
TEXT_PARTS = ("input_text", "output_text", "text")
# Output a client may ask `include` for that this server never makes; asking for it is harmless.
INCLUDABLE = (
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)
# Fields that ask for what this server does not do, with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple] = {
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
}


class FunctionTool(BaseModel):
    """A tool in the Responses API's flat shape; `type` is checked in `chat_tools` (a clear 400 for a
    hosted tool such as web_search)."""

    model_config = ConfigDict(extra="ignore")
    type: str
    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)] | None = None
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool = True
    text: dict | None = None
    reasoning: dict | None = None  # accepted: these models do not reason apart from their answer
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    seed: int | None = None  # llmopt's extra, as chat's
    ignore_eos: bool = False  # vLLM's extra, as chat's: the bench fixes output lengths with it

    def unsupported_field(self) -> str | None:
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in extra and not any(extra[name] == value for value in neutral):
                return name
        for value in self.include or []:
            if value not in INCLUDABLE:
                return "include"
        return None


class ResponsesAPI:
    """The routes of the Responses API over the shared chat path and the response store."""

    def __init__(self, routes: Routes, store: ResponseStore):
        self.routes, self.store = routes, store

    async def create(self, req: ResponsesRequest, request: Request) -> Response:
        if (name := req.unsupported_field()) is not None:
            value = (req.model_extra or {}).get(name, req.include)
            raise APIError(
                400, f"{name}: {json.dumps(value)[:80]} is not supported by this server", param=name
            )
        owner = owner_of(dict(request.scope["headers"]))
        items = self.conversation(req, owner) + input_items(req.input)
        call = chat_call(req, items)
        started = await self.routes.start_chat(call)
        frame = ResponseFrame.new(req, self.routes.settings.served_model_name, started.prompt_tokens)
        store = self.storer(req, owner, items)
        if req.stream:
            events = response_events(frame, started, store)
            return StreamingResponse(events, media_type="text/event-stream")
        body = await response_body(frame, started, request)
        store(body)
        return JSONResponse(body)

    def conversation(self, req: ResponsesRequest, owner: str) -> list[dict]:
        """The stored items `previous_response_id` continues (none without it)."""
        if req.previous_response_id is None:
            if not req.input:
                raise APIError(400, "input must not be empty", param="input")
            return []
        stored = self.store.get(req.previous_response_id, owner)
        if stored is None:
            raise APIError(
                404,
                f"Previous response with id '{req.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return list(stored.items)

    def storer(self, req: ResponsesRequest, owner: str, items: list[dict]):
        """What keeps a finished response (its body, and the conversation with its output), if asked to."""

        def store(body: dict) -> None:
            if req.store and body["status"] in ("completed", "incomplete"):
                entry = StoredResponse.of(owner, body, items + body["output"])
                self.store.put(body["id"], entry)

        return store

    async def retrieve(self, response_id: str, request: Request) -> dict:
        return self.stored(response_id, request).body

    async def delete(self, response_id: str, request: Request) -> dict:
        self.stored(response_id, request)
        self.store.delete(response_id, owner_of(dict(request.scope["headers"])))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def stored(self, response_id: str, request: Request) -> StoredResponse:
        stored = self.store.get(response_id, owner_of(dict(request.scope["headers"])))
        if stored is None:  # another key's response is as absent as a missing one
            message = f"Response with id '{response_id}' not found."
            raise APIError(404, message, param="response_id", code="not_found")
        return stored


def chat_call(req: ResponsesRequest, items: list[dict]) -> ChatCall:
    """The internal chat request of a Responses request whose conversation is `items`."""
    messages = chat_messages(items)
    if req.instructions:  # not carried over from a previous response, as OpenAI documents
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    if not messages:
        raise APIError(400, "the conversation has no messages", param="input")
    tools = chat_tools(req.tools)
    fields: dict = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tools": tools,
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "stream": req.stream,
        "seed": req.seed,
        "ignore_eos": req.ignore_eos,
        "user": req.user,
    }
    try:
        request = ChatCompletionRequest(**fields)
    except ValidationError as exc:  # the request's own schema checked each field: a mismatch is a bug
        raise APIError(400, f"the request does not translate to a chat request: {exc}") from None
    return ChatCall(request, text_format(req.text), FIELD_NAMES)


def input_items(value: str | list[dict]) -> list[dict]:
    """The request's input as items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}] if value else []
    return list(value)


def chat_messages(items: list[dict]) -> list[ChatMessage]:
    """Chat messages of Responses items: a message item is a message; consecutive function_call items
    are the tool calls of the assistant message before them (one is opened if there is none); each
    function_call_output item is a tool message; reasoning items are dropped."""
    messages: list[ChatMessage] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise APIError(400, f"input[{i}] must be an object", param="input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(message_of(item, i))
        elif kind == "function_call":
            call = tool_call_of(item, i)
            last = messages[-1] if messages else None
            if last is None or last.role != "assistant":
                last = ChatMessage(role="assistant", content=None, tool_calls=[])
                messages.append(last)
            last.tool_calls = [*(last.tool_calls or []), call]
        elif kind == "function_call_output":
            call_id = text_field(item, "call_id", i)
            messages.append(ChatMessage(role="tool", content=output_text(item, i), tool_call_id=call_id))
        elif kind == "reasoning":
            continue
        else:
            raise APIError(
                400,
                f"input[{i}].type {kind!r} is not supported: this server takes message, function_call, "
                "function_call_output and reasoning items",
                param="input",
            )
    return messages


def message_of(item: dict, i: int) -> ChatMessage:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise APIError(
            400, f"input[{i}].role must be user, assistant, system or developer, not {role!r}", param="input"
        )
    content = item.get("content")
    if isinstance(content, str):
        return ChatMessage(role=role, content=content)
    if not isinstance(content, list):
        raise APIError(400, f"input[{i}].content must be a string or a list of parts", param="input")
    return ChatMessage(role=role, content="".join(part_text(part, i, j) for j, part in enumerate(content)))


def part_text(part: object, i: int, j: int) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS and isinstance(part.get("text"), str):
        return part["text"]
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    raise APIError(
        400,
        f"input[{i}].content[{j}]: content parts of type {kind!r} are not supported: this server reads "
        "text only (input_text, output_text)",
        param="input",
    )


def tool_call_of(item: dict, i: int) -> MessageToolCall:
    arguments = text_field(item, "arguments", i)
    try:
        json.loads(arguments)
    except (ValueError, RecursionError):
        raise APIError(
            400, f"input[{i}].arguments must be JSON text, got {arguments[:80]!r}", param="input"
        ) from None
    function = ToolCallFunction(name=text_field(item, "name", i), arguments=arguments)
    return MessageToolCall(id=text_field(item, "call_id", i), function=function)


def output_text(item: dict, i: int) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(part_text(part, i, j) for j, part in enumerate(output))
    raise APIError(400, f"input[{i}].output must be a string or a list of text parts", param="input")


def text_field(item: dict, name: str, i: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(400, f"input[{i}].{name} must be a string", param="input")
    return value


def chat_tools(tools: list[FunctionTool] | None) -> list[ToolDefinition] | None:
    """The flat Responses tools as chat's; a hosted tool (web_search, file_search, ...) is a 400."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type != "function" or tool.name is None:
            what = f"of type {tool.type!r}" if tool.type != "function" else "without a name"
            raise APIError(
                400,
                f"tools[{i}]: a tool {what} is not supported: this server runs function tools",
                param="tools",
            )
        function = FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
        )
        out.append(ToolDefinition(type="function", function=function))
    return out


def chat_tool_choice(choice: str | dict | None) -> str | NamedToolChoice | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice["name"]))
    raise APIError(
        400,
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
        param="tool_choice",
    )


def text_format(text: dict | None) -> RequestedOutput | None:
    """`text.format` as the structured output it asks for (text: none), checked as chat's
    response_format is, every error naming `text`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise APIError(400, 'text.format must be an object with a "type"', param="text")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return RequestedOutput(from_value("json_object", True, "text"), "text")
    if kind == "json_schema":
        if "schema" not in fmt:
            raise APIError(400, 'text.format of type json_schema needs a "schema"', param="text")
        return RequestedOutput(from_value("json_schema", fmt["schema"], "text"), "text")
    raise APIError(
        400, f"text.format.type must be text, json_object or json_schema, not {kind!r}", param="text"
    )
