"""Response bodies of /v1/completions and /v1/chat/completions: the JSON body, or server-sent events
(one chunk per text delta, then usage if asked, then [DONE]). The two endpoints differ only in what
a ResponseShape says; the rest, usage included, is written once for both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmopt.engine.outputs import RequestOutput
from llmopt.server.error_bodies import APIError, aborted_error, request_failed
from llmopt.server.logprobs import LogprobsWriter
from llmopt.server.protocol import SamplingRequest
from llmopt.server.request_group import RequestGroup
from llmopt.server.tool_parsers import ChoiceParser, ToolCallDelta, assemble

DONE = "data: [DONE]\n\n"


@dataclass
class ResponseUsage:
    """Token totals of one response, its `usage` block (no bill: that is pricing.Usage); a prompt shared by
    n choices counts once, as OpenAI counts it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # from the prefix cache, either tier
    # Of cached_tokens, loaded from the KV disk tier (llmopt's own field beside OpenAI's cached_tokens:
    # clients that do not know it ignore it; `llmopt bench` splits TTFT by it).
    disk_cached_tokens: int = 0

    def add(self, output: RequestOutput, index: int, n_per_prompt: int) -> None:
        if not output.finished:  # only a request's last output carries its totals
            return
        self.completion_tokens += output.output_tokens
        if index % n_per_prompt == 0:
            self.prompt_tokens += output.prompt_tokens
            self.cached_tokens += output.cached_tokens
            self.disk_cached_tokens += output.disk_cached_tokens

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "disk_cached_tokens": self.disk_cached_tokens,
            },
        }


@dataclass(frozen=True)
class ResponseShape:
    """What tells one endpoint's responses from the other's."""

    object: str  # the JSON body's "object"
    chunk_object: str  # each stream chunk's "object"
    id_prefix: str
    content: Callable[[str], dict]  # a choice's whole text, in the JSON body
    delta: Callable[[str], dict]  # a piece of a choice's text, in a stream chunk
    opening: Callable[[], dict] | None  # what each choice's stream opens with, before any text

    def choice(self, index: int, body: dict, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        return {"index": index, **body, "logprobs": logprobs, "finish_reason": finish_reason}


def _chat_delta(text: str) -> dict:
    return {"delta": {"content": text} if text else {}}


def _chat_opening() -> dict:
    # OpenAI's first chunk names the role, so that clients know whose message the deltas build.
    return {"delta": {"role": "assistant", "content": ""}}


TEXT_COMPLETION = ResponseShape(
    object="text_completion",
    chunk_object="text_completion",
    id_prefix="cmpl-",
    content=lambda text: {"text": text},
    delta=lambda text: {"text": text},
    opening=None,
)
CHAT_COMPLETION = ResponseShape(
    object="chat.completion",
    chunk_object="chat.completion.chunk",
    id_prefix="chatcmpl-",
    content=lambda text: {"message": {"role": "assistant", "content": text}},
    delta=_chat_delta,
    opening=_chat_opening,
)


@dataclass(frozen=True)
class Reply:
    """What the body and every chunk of one response share."""

    shape: ResponseShape
    model: str
    id: str
    created: int
    parser: Callable[[], ChoiceParser | None] | None = None  # reads tool calls out of a choice's text
    logprobs: LogprobsWriter | None = None  # the choices' logprobs and echo, when asked for

    @classmethod
    def new(
        cls, shape: ResponseShape, model: str, parser: Callable[[], ChoiceParser | None] | None = None
    ) -> Reply:
        return cls(shape, model, shape.id_prefix + uuid.uuid4().hex, int(time.time()), parser)

    def new_parser(self) -> ChoiceParser | None:
        return self.parser() if self.parser is not None else None

    def body(self, object_: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


async def respond(
    req: SamplingRequest,
    group: RequestGroup,
    shape: ResponseShape,
    model: str,
    http_request: Request,
    parser: Callable[[], ChoiceParser | None] | None = None,
    logprobs: LogprobsWriter | None = None,
) -> Response:
    reply = replace(Reply.new(shape, model, parser), logprobs=logprobs)
    if req.stream:  # a stream notices a gone client when a write fails, and aborts then
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(stream(group, reply, include_usage), media_type="text/event-stream")
    watcher = asyncio.create_task(abort_on_disconnect(http_request, group))
    try:
        return await complete(group, reply)
    finally:
        watcher.cancel()


async def abort_on_disconnect(http_request: Request, group: RequestGroup) -> None:
    """A JSON response writes nothing until it is complete, so only the ASGI disconnect message tells
    that its client left: then the engine stops generating for it and its KV blocks go back."""
    with contextlib.suppress(asyncio.CancelledError):
        while (await http_request.receive())["type"] != "http.disconnect":
            pass
        group.abort()


def ended_early(out: RequestOutput, group: RequestGroup) -> APIError | None:
    """The error a finished output stands for: an abort (shutdown, failed step) or this request's failure."""
    if out.finish_reason == "abort":
        return aborted_error(group.engine_thread.stopping)
    if out.finish_reason == "error":
        return request_failed(out.error)
    return None


async def complete(group: RequestGroup, reply: Reply) -> JSONResponse:
    """The whole response at once, after every choice has finished."""
    writer = reply.logprobs
    echoes = [writer.take_echo(i) if writer is not None else "" for i in range(len(group.request_ids))]
    texts = [""] * len(group.request_ids)
    finish: list[str | None] = [None] * len(group.request_ids)
    usage = ResponseUsage()
    async for index, out in group.outputs():
        texts[index] += out.new_text
        if writer is not None:
            writer.collect(index, out)
        if out.finished:
            if (error := ended_early(out, group)) is not None:
                raise error
            finish[index] = out.finish_reason
        usage.add(out, index, group.n_per_prompt)
    shape = reply.shape
    choices = [whole_choice(reply, i, t, f, e) for i, (t, f, e) in enumerate(zip(texts, finish, echoes))]
    body = reply.body(shape.object, choices)
    if writer is not None:
        for i, choice in enumerate(choices):
            choice["logprobs"] = writer.whole(i)
            if writer.prompt_top is not None and writer.legacy:  # vLLM: per choice on completions
                choice["prompt_logprobs"] = writer.prompt_logprobs(i)
        if writer.prompt_top is not None and not writer.legacy:  # and once per response on chat
            body["prompt_logprobs"] = writer.prompt_logprobs(0)
    return JSONResponse({**body, "usage": usage.to_dict()})


def whole_choice(reply: Reply, index: int, text: str, finish: str | None, echo: str = "") -> dict:
    """A finished choice of the JSON body: its text, or its tool calls and what text is left. The text
    goes through the same parser as a stream's, so the two agree; echo's text is content as it is."""
    shape = reply.shape
    parser = reply.new_parser()
    if parser is None:
        return shape.choice(index, shape.content(echo + text), finish)
    content, calls = assemble(parser.feed(text) + parser.finish())
    content = echo + content
    if not calls:
        return shape.choice(index, shape.content(content), finish)
    message = {"role": "assistant", "content": content or None, "tool_calls": calls}
    return shape.choice(index, {"message": message}, tool_finish_reason(finish, parser))


def tool_finish_reason(finish: str | None, parser: ChoiceParser) -> str | None:
    """OpenAI's "tool_calls" for an answer that ended with calls; "length" stays (an answer cut short)."""
    return "tool_calls" if parser.calls and finish == "stop" else finish


def stream_bodies(
    reply: Reply, parsers: dict[int, ChoiceParser | None], index: int, out: RequestOutput
) -> list[tuple[dict, str | None]]:
    """The chunk bodies one engine output makes for its choice, each with its finish reason (only the
    last of a finished choice has one). With a tool parser, text it holds back makes no chunk."""
    finish = out.finish_reason if out.finished else None
    if index not in parsers:
        parsers[index] = reply.new_parser()
    parser = parsers[index]
    if parser is None:
        return [(reply.shape.delta(out.new_text), finish)]
    pieces = parser.feed(out.new_text) + (parser.finish() if out.finished else [])
    bodies = [
        {"delta": {"tool_calls": [p.to_dict()]}} if isinstance(p, ToolCallDelta) else reply.shape.delta(p)
        for p in pieces
    ]
    if not out.finished:
        return [(body, None) for body in bodies]
    bodies = bodies or [reply.shape.delta("")]
    return [(body, None) for body in bodies[:-1]] + [(bodies[-1], tool_finish_reason(finish, parser))]


async def stream(group: RequestGroup, reply: Reply, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events; an engine abort mid-stream (the status line is long sent) is an error event."""
    shape = reply.shape

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        body = reply.body(shape.chunk_object, choices)
        if include_usage:  # OpenAI's clients expect usage on every chunk then, null until the last
            body["usage"] = usage
        return _event(body)

    opened: set[int] = set()
    parsers: dict[int, ChoiceParser | None] = {}
    templates: dict[int, TextChunk | None] = {}
    usage = ResponseUsage()
    async for index, out in group.outputs():
        # Most chunks are a plain text delta (no logprobs, no tool parser, not the last): written from
        # the choice's pre-rendered chunk, the text its only part to encode. Its first output takes the
        # full path below (the role chunk, the parser made), so `parsers` already tells there is none.
        if out.new_text and not out.finished and reply.logprobs is None and parsers.get(index, 0) is None:
            if index not in templates:
                templates[index] = TextChunk.of(reply, index, include_usage)
            if (template := templates[index]) is not None:
                yield template.render(out.new_text)
                continue
        if shape.opening is not None and index not in opened:
            # The role goes with the choice's first output, as vLLM's server sends it: a client that
            # times the first chunk (vllm bench serve does) then measures the real time to first token.
            opened.add(index)
            yield chunk([shape.choice(index, shape.opening(), None)])
        if out.finished and (error := ended_early(out, group)) is not None:
            yield _event({"error": {"message": error.message, "type": error.type, "code": error.status}})
            yield DONE
            return
        logprobs = None
        if (writer := reply.logprobs) is not None:
            logprobs = writer.chunk(index, out)
            echoed = writer.take_echo(index)
            if writer.legacy:  # the prompt's text goes with its logprobs
                out = replace(out, new_text=echoed + out.new_text)
            elif echoed:  # chat: a content chunk of its own after the role, as vLLM sends it
                yield chunk([shape.choice(index, shape.delta(echoed), None)])
        if out.new_text or out.finished or logprobs is not None:
            bodies = stream_bodies(reply, parsers, index, out)
            if not bodies and logprobs is not None:  # tokens whose text is held back keep their logprobs
                bodies = [(shape.delta(""), None)]
            for i, (body, finish) in enumerate(bodies):
                yield chunk([shape.choice(index, body, finish, logprobs if i == 0 else None)])
        usage.add(out, index, group.n_per_prompt)
    if include_usage:
        yield chunk([], usage.to_dict())
    yield DONE


def _event(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


TEXT_PLACEHOLDER = "\x00"  # json writes it as the 8 characters "\u0000", which no other field holds


@dataclass(frozen=True)
class TextChunk:
    """One choice's plain text-delta event, rendered once around a placeholder: each token's event is
    then `head + json(text) + tail`, the same bytes as rendering its whole body (json writes a string
    the same wherever it stands) without building and encoding the body's dicts every token."""

    head: str
    tail: str

    @classmethod
    def of(cls, reply: Reply, index: int, include_usage: bool) -> TextChunk | None:
        """The template, or None where the placeholder is not found exactly once (a model name holding
        it): that choice's chunks are then rendered whole."""
        shape = reply.shape
        body = reply.body(shape.chunk_object, [shape.choice(index, shape.delta(TEXT_PLACEHOLDER), None)])
        if include_usage:
            body["usage"] = None
        parts = _event(body).split(json.dumps(TEXT_PLACEHOLDER))
        return cls(parts[0], parts[1]) if len(parts) == 2 else None

    def render(self, text: str) -> str:
        return self.head + json.dumps(text, ensure_ascii=False) + self.tail
