"""A Responses API answer written from the chat path's deltas (deltas.py): the response object, its output
items (a `message` with `output_text`, a `function_call` per call) and, for a stream, OpenAI's event
sequence: `response.created`, `response.in_progress`, per item `response.output_item.added`, then
`response.content_part.added` and `response.output_text.delta`s (a message) or
`response.function_call_arguments.delta`s (a call), their `.done` events and `response.output_item.done`,
and at the end `response.completed` (`response.incomplete` when cut by max_output_tokens, and
`response.failed` when the engine ends the request). A body and a stream are built by the same
`OutputItems`, so they carry the same items."""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from llmopt.server.chat_call import StartedChat
from llmopt.server.deltas import Delta, choice_deltas
from llmopt.server.error_bodies import APIError
from llmopt.server.responses import ResponseUsage, abort_on_disconnect
from llmopt.server.tool_parsers import Piece, ToolCallDelta

if TYPE_CHECKING:
    from llmopt.server.responses_api import ResponsesRequest


@dataclass(frozen=True)
class ResponseFrame:
    """What the response object and every event of one response share: its id, creation time, model
    and the request's settings, which the object echoes as OpenAI's does."""

    id: str
    created_at: int
    model: str
    echo: dict

    @classmethod
    def new(cls, req: ResponsesRequest, model: str, prompt_tokens: int) -> ResponseFrame:
        echo = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "user": req.user,
            "background": False,
        }
        return cls("resp_" + uuid.uuid4().hex, int(time.time()), model, echo)

    def body(
        self,
        status: str,
        output: list[dict],
        usage: ResponseUsage | None = None,
        error: APIError | None = None,
    ) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        failed = {"code": "server_error", "message": error.message} if error is not None else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": failed,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": usage_body(usage) if usage is not None else None,
            **self.echo,
        }


def usage_body(usage: ResponseUsage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": 0,
            "disk_cached_tokens": usage.disk_cached_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


class OutputItems:
    """The output items that pieces of an answer add up to, one item open at a time; each step returns
    the stream events it makes (a JSON body ignores them)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.open: dict | None = None

    def add(self, piece: Piece) -> list[dict]:
        if isinstance(piece, ToolCallDelta):
            return self.add_call(piece)
        if not piece:
            return []
        events = [] if self.open is not None and self.open["type"] == "message" else self.open_message()
        item = self.open
        assert item is not None
        item["content"][0]["text"] += piece
        delta = {"delta": piece, "logprobs": []}
        return events + [self.event("response.output_text.delta", item, content_index=0, **delta)]

    def add_call(self, piece: ToolCallDelta) -> list[dict]:
        events: list[dict] = []
        if piece.id is not None:  # a new call
            events += self.close("completed")
            item = {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex,
                "call_id": piece.id,
                "name": piece.name,
                "arguments": "",
                "status": "in_progress",
            }
            events += self.start(item)
        item = self.open
        assert item is not None and item["type"] == "function_call", "a call's pieces follow its start"
        if piece.arguments:
            item["arguments"] += piece.arguments
            events.append(self.event("response.function_call_arguments.delta", item, delta=piece.arguments))
        return events

    def open_message(self) -> list[dict]:
        events = self.close("completed")
        item = {
            "type": "message",
            "id": "msg_" + uuid.uuid4().hex,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        events += self.start(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        added = self.event("response.content_part.added", item, content_index=0, part=copy.deepcopy(part))
        events.append(added)
        return events

    def start(self, item: dict) -> list[dict]:
        self.open = item
        self.items.append(item)
        return [self.event("response.output_item.added", item, item=copy.deepcopy(item))]

    def close(self, status: str) -> list[dict]:
        """End the open item (if any) with `status`: its .done events."""
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            text = {"text": part["text"], "logprobs": []}
            events.append(self.event("response.output_text.done", item, content_index=0, **text))
            part_done = {"part": copy.deepcopy(part)}
            events.append(self.event("response.content_part.done", item, content_index=0, **part_done))
        else:
            done = {"name": item["name"], "arguments": item["arguments"]}
            events.append(self.event("response.function_call_arguments.done", item, **done))
        return events + [self.event("response.output_item.done", item, item=copy.deepcopy(item))]

    def finish(self, finish_reason: str | None) -> list[dict]:
        """The last item closed; an answer with no item at all has an empty message, as OpenAI's."""
        events = [] if self.items else self.open_message()
        return events + self.close(status_of(finish_reason))

    def event(self, kind: str, of: dict, **fields) -> dict:
        """An event about item `of` (its own added / done events carry the item whole)."""
        index = next(i for i, known in enumerate(self.items) if known is of)
        if kind in ("response.output_item.added", "response.output_item.done"):
            return {"type": kind, "output_index": index, **fields}
        return {"type": kind, "item_id": of["id"], "output_index": index, **fields}


async def response_body(frame: ResponseFrame, started: StartedChat, http_request: Request) -> dict:
    """The whole response at once. A non-streamed request writes nothing until it is done, so only the
    ASGI disconnect message tells that its client left: then the engine stops generating for it."""
    watcher = asyncio.create_task(abort_on_disconnect(http_request, started.group))
    output = OutputItems()
    last: Delta | None = None
    try:
        async for delta in choice_deltas(started.group, started.parser):
            for piece in delta.pieces:
                output.add(piece)
            last = delta
    finally:
        watcher.cancel()
    assert last is not None and last.usage is not None, "a choice's last delta has its usage"
    output.finish(last.finish_reason)
    return frame.body(status_of(last.finish_reason), output.items, last.usage)


async def response_events(
    frame: ResponseFrame, started: StartedChat, store: Callable[[dict], None]
) -> AsyncIterator[str]:
    """The response as server-sent events (`event:` the type, `data:` the event with its sequence
    number); `store` keeps the finished response. A gone client ends the generator at a failed write,
    and the group's outputs() then aborts the engine request."""
    sequence = 0

    def sse(event: dict) -> str:
        nonlocal sequence
        event["sequence_number"] = sequence
        sequence += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    yield sse({"type": "response.created", "response": frame.body("in_progress", [])})
    yield sse({"type": "response.in_progress", "response": frame.body("in_progress", [])})
    output = OutputItems()
    last: Delta | None = None
    try:
        async for delta in choice_deltas(started.group, started.parser):
            for piece in delta.pieces:
                for event in output.add(piece):
                    yield sse(event)
            last = delta
    except APIError as error:
        for event in output.close("incomplete"):
            yield sse(event)
        yield sse({"type": "response.failed", "response": frame.body("failed", output.items, error=error)})
        return
    assert last is not None and last.usage is not None, "a choice's last delta has its usage"
    for event in output.finish(last.finish_reason):
        yield sse(event)
    status = status_of(last.finish_reason)
    body = frame.body(status, output.items, last.usage)
    store(body)
    yield sse({"type": f"response.{status}", "response": body})
