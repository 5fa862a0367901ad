"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), translated at the
edge into the one internal chat request (chat_call.py): `system` becomes the system message, text blocks
the messages' text, an assistant's `tool_use` blocks its tool calls and a user's `tool_result` blocks
tool messages (`thinking` blocks are dropped: these models write none), tools with `input_schema` chat's
function tools, `tool_choice` auto / any / tool / none chat's auto / required / a named function / none,
`stop_sequences` chat's stop, `output_config.format` the structured output. `cache_control` is accepted
anywhere: the prefix cache caches every prompt without being asked. The answer is written back as
content blocks by messages_events.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmopt.server.chat_call import ChatCall
from llmopt.server.error_bodies import APIError
from llmopt.server.messages_events import MessageFrame, message_body, message_events
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
    checked_stop_strings,
)
from llmopt.server.structured_outputs import RequestedOutput, from_value
from llmopt.server.tools import ToolChoice

if TYPE_CHECKING:
    from llmopt.server.routes import Routes

FIELD_NAMES = {"stop": "stop_sequences", "prompt": "messages"}
CHAT_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# Fields that ask for what this server does not do, with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple] = {"mcp_servers": (None, []), "container": (None,)}


class AnthropicTool(BaseModel):
    """A client tool (`type` absent or "custom"); a server tool (web search, bash, ...) is refused in
    `chat_tools`, naming it."""

    model_config = ConfigDict(extra="ignore")
    type: str | None = None
    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: str | None = None
    input_schema: dict | None = None
    cache_control: dict | None = None


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[dict]


class MessagesPrompt(BaseModel):
    """What a Messages request and a count_tokens request share: the prompt."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[dict] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None  # accepted: these models do not think apart from their answer

    def unsupported_field(self) -> str | None:
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in extra and not any(extra[name] == value for value in neutral):
                return name
        return None


class MessagesRequest(MessagesPrompt):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    metadata: dict | None = None
    # Anthropic's structured outputs: {"format": {"type": "json_schema", "schema": ...}}; `effort` is
    # accepted (these models have one effort).
    output_config: dict | None = None
    ignore_eos: bool = False  # vLLM's extra, as chat's: the bench fixes output lengths with it

    @field_validator("stop_sequences")
    @classmethod
    def _stop_sequences_are_searchable(cls, stop: list[str] | None) -> list[str] | None:
        return checked_stop_strings(stop)


class MessagesAPI:
    """The routes of the Messages API over the shared chat path."""

    def __init__(self, routes: Routes):
        self.routes = routes

    async def create(self, req: MessagesRequest, request: Request) -> Response:
        refuse_unsupported(req)
        started = await self.routes.start_chat(chat_call(req))
        frame = MessageFrame.new(req, self.routes.settings.served_model_name, started.prompt_tokens)
        stop_sequence = self.stop_sequence_finder(req)
        if req.stream:
            events = message_events(frame, started, stop_sequence)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(await message_body(frame, started, stop_sequence, request))

    async def count_tokens(self, req: MessagesPrompt) -> dict:
        """The prompt's tokens as a Messages request would count them (its `usage.input_tokens` plus
        what it read from the cache): templated with its tools."""
        refuse_unsupported(req)
        self.routes.check_model(req.model)
        messages = chat_messages(req)
        tools = ToolChoice.of(chat_tools(req.tools), chat_tool_choice(req.tool_choice))
        prompt = await self.routes.off_loop(self.routes.chat_prompt, messages, tools)
        return {"input_tokens": len(prompt)}

    def stop_sequence_finder(self, req: MessagesRequest):
        """Which stop sequence ended an answer (None: an end-of-turn token did). The engine cuts the
        text where the stop string starts and says only "stop", so the answer's tokens are decoded again
        and the stop sequence sought where its text ends (off the event loop, with the tokenizer)."""
        stops = req.stop_sequences or []
        engine = self.routes.engine

        async def find(token_ids: list[int], text: str) -> str | None:
            if not stops or not token_ids or token_ids[-1] in engine.eos_token_ids:
                return None
            full = await self.routes.off_loop(engine.tokenizer.decode, token_ids)
            return matched_stop(full, text, stops)

        return find


def matched_stop(full: str, text: str, stops: list[str]) -> str | None:
    """The stop sequence that begins where the answer's `text` ends in `full` (its tokens decoded), as
    the engine's detokenizer picks it (the earliest, then the least); else the earliest anywhere."""
    here = [s for s in stops if full.startswith(s, len(text))]
    if here:
        return min(here)
    found = [(i, s) for s in stops if (i := full.find(s)) != -1]
    return min(found)[1] if found else None


def refuse_unsupported(req: MessagesPrompt) -> None:
    if (name := req.unsupported_field()) is not None:
        raise APIError(400, f"{name} is not supported by this server", param=name)


def chat_call(req: MessagesRequest) -> ChatCall:
    tool_choice = chat_tool_choice(req.tool_choice)
    fields: dict = {
        "model": req.model,
        "messages": chat_messages(req),
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": -1 if req.top_k is None else req.top_k,
        "stop": req.stop_sequences,
        "tools": chat_tools(req.tools),
        "tool_choice": tool_choice,
        "parallel_tool_calls": not (req.tool_choice or {}).get("disable_parallel_tool_use", False),
        "stream": req.stream,
        "ignore_eos": req.ignore_eos,
    }
    try:
        request = ChatCompletionRequest(**fields)
    except ValidationError as exc:  # the request's own schema checked each field: a mismatch is a bug
        raise APIError(400, f"the request does not translate to a chat request: {exc}") from None
    return ChatCall(request, output_format(req.output_config), FIELD_NAMES)


def output_format(config: dict | None) -> RequestedOutput | None:
    """`output_config.format` as the structured output it asks for, checked as chat's response_format."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        message = 'output_config.format must be {"type": "json_schema", "schema": ...}'
        raise APIError(400, message, param="output_config")
    return RequestedOutput(from_value("json_schema", fmt["schema"], "output_config"), "output_config")


def chat_messages(req: MessagesPrompt) -> list[ChatMessage]:
    """The conversation as chat messages, the system prompt first."""
    messages = []
    system = system_text(req.system)
    if system:
        messages.append(ChatMessage(role="system", content=system))
    for i, message in enumerate(req.messages):
        if isinstance(message.content, str):
            messages.append(ChatMessage(role=message.role, content=message.content))
        elif message.role == "user":
            messages += user_messages(message.content, i)
        else:
            messages.append(assistant_message(message.content, i))
    return messages


def system_text(system: str | list[dict] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(block_text(block, f"system[{j}]", "system") for j, block in enumerate(system))


def block_text(block: object, where: str, param: str) -> str:
    """A text block's text; any other block here is a 400 naming where it is."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"]
    raise APIError(
        400,
        f"{where}: content blocks of type {kind!r} are not supported here: this server reads text",
        param=param,
    )


def user_messages(blocks: list[dict], i: int) -> list[ChatMessage]:
    """A user turn: each tool_result block a tool message, runs of text blocks a user message, in order."""
    out: list[ChatMessage] = []
    text: list[str] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            if text:
                out.append(ChatMessage(role="user", content="".join(text)))
                text = []
            out.append(tool_result(block, f"messages[{i}].content[{j}]"))
        else:
            text.append(block_text(block, f"messages[{i}].content[{j}]", "messages"))
    if text:
        out.append(ChatMessage(role="user", content="".join(text)))
    return out


def tool_result(block: dict, where: str) -> ChatMessage:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str):
        raise APIError(400, f"{where}.tool_use_id must be a string", param="messages")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(block_text(b, f"{where}.content[{k}]", "messages") for k, b in enumerate(content))
    elif not isinstance(content, str):
        raise APIError(400, f"{where}.content must be a string or a list of text blocks", param="messages")
    if block.get("is_error"):  # the model reads that the call failed, not a result
        content = f"Error: {content}"
    return ChatMessage(role="tool", content=content, tool_call_id=tool_use_id)


def assistant_message(blocks: list[dict], i: int) -> ChatMessage:
    """An assistant turn: its text blocks' text and its tool_use blocks as calls; thinking dropped."""
    text: list[str] = []
    calls: list[MessageToolCall] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            calls.append(tool_use_call(block, where))
        elif kind not in ("thinking", "redacted_thinking"):
            text.append(block_text(block, where, "messages"))
    return ChatMessage(role="assistant", content="".join(text) or None, tool_calls=calls or None)


def tool_use_call(block: dict, where: str) -> MessageToolCall:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
        message = f"{where}: a tool_use block needs a string id and name and an object input"
        raise APIError(400, message, param="messages")
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments, ensure_ascii=False))
    return MessageToolCall(id=call_id, function=function)


def chat_tools(tools: list[AnthropicTool] | None) -> list[ToolDefinition] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            message = (
                f"tools[{i}]: server tools ({tool.type!r}) are not supported: this server runs client tools"
            )
            raise APIError(400, message, param="tools")
        function = FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.input_schema
        )
        out.append(ToolDefinition(type="function", function=function))
    return out


def chat_tool_choice(choice: dict | None) -> str | NamedToolChoice | None:
    if choice is None:
        return None
    kind = choice.get("type")
    if isinstance(kind, str) and kind in CHAT_TOOL_CHOICE:
        return CHAT_TOOL_CHOICE[kind]
    if kind == "tool" and isinstance(choice.get("name"), str):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice["name"]))
    raise APIError(
        400,
        'tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
        '{"type": "tool", "name": ...}',
        param="tool_choice",
    )
