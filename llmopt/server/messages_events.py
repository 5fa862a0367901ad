"""A Messages API answer written from the chat path's deltas (deltas.py): the message with its content
blocks (`text`, and `tool_use` per call with its input parsed), stop_reason and usage, and for a stream
Anthropic's events: `message_start`, per block `content_block_start`, `content_block_delta`s
(`text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` (stop reason and the
final usage) and `message_stop`; an engine that ends the request sends an `error` event. A body and a
stream are built by the same `ContentBlocks`, so they carry the same blocks.

Usage in Anthropic's terms: `input_tokens` are the prompt tokens not read from the cache and
`cache_read_input_tokens` those the prefix cache served (their sum is the prompt); nothing is billed as
a cache write. `message_start` says the whole prompt as input (what was cached is known only when the
request ends); `message_delta` then carries the final counts, which the `anthropic` client takes."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from llmopt.server.chat_call import StartedChat
from llmopt.server.deltas import Delta, choice_deltas
from llmopt.server.error_bodies import APIError
from llmopt.server.responses import ResponseUsage, abort_on_disconnect
from llmopt.server.tool_parsers import Piece, ToolCallDelta

if TYPE_CHECKING:
    from llmopt.server.messages_api import MessagesRequest

StopFinder = Callable[[list[int], str], Awaitable[str | None]]  # which stop sequence ended an answer
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


@dataclass(frozen=True)
class MessageFrame:
    id: str
    model: str
    prompt_tokens: int

    @classmethod
    def new(cls, req: MessagesRequest, model: str, prompt_tokens: int) -> MessageFrame:
        return cls("msg_" + uuid.uuid4().hex, model, prompt_tokens)

    def message(
        self, content: list[dict], stop_reason: str | None, stop_sequence: str | None, usage: dict
    ) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }


def usage_body(usage: ResponseUsage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


class ContentBlocks:
    """The content blocks that pieces of an answer add up to, one block open at a time; each step
    returns the stream events it makes (a JSON body ignores them)."""

    def __init__(self) -> None:
        self.blocks: list[dict] = []
        self.arguments: dict[int, str] = {}  # a tool_use block's input as JSON text, by block index
        self.open: int | None = None

    def add(self, piece: Piece) -> list[dict]:
        if isinstance(piece, ToolCallDelta):
            return self.add_call(piece)
        if not piece:
            return []
        in_text = self.open is not None and self.blocks[self.open]["type"] == "text"
        events = [] if in_text else self.start({"type": "text", "text": ""})
        assert self.open is not None
        self.blocks[self.open]["text"] += piece
        return events + [self.delta({"type": "text_delta", "text": piece})]

    def add_call(self, piece: ToolCallDelta) -> list[dict]:
        events: list[dict] = []
        if piece.id is not None:  # a new call; Anthropic's ids read toolu_...
            block_id = "toolu_" + piece.id.removeprefix("call_")
            events += self.start({"type": "tool_use", "id": block_id, "name": piece.name, "input": {}})
        assert self.open is not None and self.open in self.arguments, "a call's pieces follow its start"
        if piece.arguments:
            self.arguments[self.open] += piece.arguments
            events.append(self.delta({"type": "input_json_delta", "partial_json": piece.arguments}))
        return events

    def start(self, block: dict) -> list[dict]:
        events = self.close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        if block["type"] == "tool_use":
            self.arguments[self.open] = ""
        start = {"type": "content_block_start", "index": self.open, "content_block": copy.deepcopy(block)}
        return events + [start]

    def delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.open, "delta": delta}

    def close(self) -> list[dict]:
        """End the open block: a tool_use block's input is its arguments parsed (a call cut short by
        max_tokens keeps {}: its stop_reason says it was cut)."""
        index, self.open = self.open, None
        if index is None:
            return []
        if index in self.arguments:
            try:
                parsed = json.loads(self.arguments[index] or "{}")
            except (ValueError, RecursionError):
                parsed = {}
            self.blocks[index]["input"] = parsed if isinstance(parsed, dict) else {}
        return [{"type": "content_block_stop", "index": index}]


@dataclass
class Ending:
    """How an answer ended, in Anthropic's words."""

    stop_reason: str
    stop_sequence: str | None
    usage: dict


async def ending(deltas: list[Delta], find_stop: StopFinder) -> Ending:
    last = deltas[-1]
    assert last.usage is not None, "a choice's last delta has its usage"
    reason = STOP_REASONS.get(last.finish_reason or "", "end_turn")
    stop_sequence = None
    if last.finish_reason == "stop":
        token_ids = [t for d in deltas for t in d.token_ids]
        stop_sequence = await find_stop(token_ids, "".join(d.text for d in deltas))
    if stop_sequence is not None:
        reason = "stop_sequence"
    return Ending(reason, stop_sequence, usage_body(last.usage))


async def message_body(
    frame: MessageFrame, started: StartedChat, find_stop: StopFinder, http_request: Request
) -> dict:
    """The whole message at once; a client that leaves meanwhile aborts the engine request (its ASGI
    disconnect message is the only sign a non-streamed request gets)."""
    watcher = asyncio.create_task(abort_on_disconnect(http_request, started.group))
    blocks = ContentBlocks()
    deltas: list[Delta] = []
    try:
        async for delta in choice_deltas(started.group, started.parser):
            for piece in delta.pieces:
                blocks.add(piece)
            deltas.append(delta)
    finally:
        watcher.cancel()
    blocks.close()
    end = await ending(deltas, find_stop)
    return frame.message(blocks.blocks, end.stop_reason, end.stop_sequence, end.usage)


async def message_events(
    frame: MessageFrame, started: StartedChat, find_stop: StopFinder
) -> AsyncIterator[str]:
    """The message as server-sent events. A gone client ends the generator at a failed write, and the
    group's outputs() then aborts the engine request."""
    start_usage = usage_body(ResponseUsage(prompt_tokens=frame.prompt_tokens))
    yield sse({"type": "message_start", "message": frame.message([], None, None, start_usage)})
    blocks = ContentBlocks()
    deltas: list[Delta] = []
    try:
        async for delta in choice_deltas(started.group, started.parser):
            for piece in delta.pieces:
                for event in blocks.add(piece):
                    yield sse(event)
            deltas.append(delta)
    except APIError as error:
        kind = "overloaded_error" if error.status == 503 else "api_error"
        yield sse({"type": "error", "error": {"type": kind, "message": error.message}})
        return
    for event in blocks.close():
        yield sse(event)
    end = await ending(deltas, find_stop)
    delta = {"stop_reason": end.stop_reason, "stop_sequence": end.stop_sequence}
    yield sse({"type": "message_delta", "delta": delta, "usage": end.usage})
    yield sse({"type": "message_stop"})


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
