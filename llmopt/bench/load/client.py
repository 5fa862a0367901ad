"""Async streaming client: one request, timed from the moment it is sent to its last byte.

Speaks only HTTP (OpenAI's /v1/completions, /v1/chat/completions and /v1/responses, Anthropic's
/v1/messages: wire.py names them), so it measures any compatible server: ours, vLLM, llama.cpp, a paid
API. Whatever a server answers, `send`
returns a record: a malformed, truncated or stalled response fails that one request, never the load point.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from llmopt.bench.auth import bearer_header
from llmopt.bench.load.messages_wire import (
    ANTHROPIC_VERSION,
    MessagesStream,
    messages_payload,
    messages_whole,
)
from llmopt.bench.load.responses_wire import responses_event, responses_payload, responses_whole
from llmopt.bench.load.structured_answer import structured_outcome
from llmopt.bench.load.token_count import TokenCounter, output_body, prompt_body
from llmopt.bench.load.wire import API_PATHS, WireError, WireEvent
from llmopt.bench.redact import redact_text
from llmopt.bench.schema import RequestRecord
from llmopt.bench.workload.bench_request import BenchRequest

# A stream line longer than this fails its request: a server that never ends a line must not fill the
# client's memory. aiohttp's own readline stops at 128 KiB, which a long chunk of text can pass.
MAX_LINE_BYTES = 16 * 2**20
ERROR_BODY_BYTES = 64 * 2**10  # of a non-200 answer, enough for its message
# What aiohttp raises when it sends on a pooled connection the server has already closed (llama.cpp's
# server closes idle kept-alive ones): "Can not write request body" (ClientOSError) or the connection
# lost before the response's status line (ServerDisconnectedError). Raised before any response byte, so
# the request never ran: it is sent once more on a fresh connection, as the openai SDK retries it.
NEVER_ANSWERED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@dataclass
class Target:
    endpoint: str  # base URL, e.g. http://127.0.0.1:8000/v1
    model: str
    api: str = "chat"  # one of wire.APIS: chat, completions, responses or messages
    api_key: str | None = None
    ignore_eos: bool = True  # vLLM's extension; fixes output lengths where the server takes it
    timeout_s: float = 600.0  # a request fails once the server sends nothing for this long
    connection_reuse: bool = True  # False: one connection per request
    stream: bool = True  # False: ask for the whole answer at once (TTFT is then its E2E)
    server_pid: int | None = None  # the server's process, where the bench started it (machine_meter.py)

    @property
    def url(self) -> str:
        return self.endpoint.rstrip("/") + API_PATHS[self.api]

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **bearer_header(self.api_key)}
        if self.api == "messages":  # Anthropic's own API reads the key from x-api-key alone
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if self.api_key:
                headers["x-api-key"] = self.api_key
        return headers

    def payload(self, req: BenchRequest) -> dict:
        if self.api == "responses":
            return responses_payload(self.model, req, self.stream, self.ignore_eos)
        if self.api == "messages":
            return messages_payload(self.model, req, self.stream, self.ignore_eos)
        return self.chat_payload(req)

    def chat_payload(self, req: BenchRequest) -> dict:
        """The request as chat or completions send it (what /tokenize counts, whatever the API)."""
        body: dict = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": 0,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if req.response_format:
            body["response_format"] = req.response_format
        elif self.ignore_eos:  # a structured answer ends where its grammar does, not at max_tokens
            body["ignore_eos"] = True
        if self.api != "completions":
            body["messages"] = req.messages or [{"role": "user", "content": req.prompt or ""}]
            if req.tools:
                body["tools"] = req.tools
        else:
            body["prompt"] = req.prompt if req.prompt is not None else req.messages[-1]["content"]
        return body


class ResponseError(WireError):
    """The response says the request failed, or is no OpenAI stream; the message is the record's error."""


class LineReader:
    """A response body as lines of any length up to `max_bytes`, one network read's worth at a time.

    Not aiohttp's readline: it gives up at 128 KiB with LineTooLong, an exception no ClientError."""

    def __init__(
        self,
        stream: aiohttp.StreamReader,
        clock: Callable[[], float] = time.perf_counter,
        max_bytes: int | None = None,
    ):
        self._stream = stream
        self._clock = clock  # when the bytes a read returns arrived (arrival_clock), else the read's time
        self._pending: list[bytes] = []  # the start of a line not yet ended, in pieces (no re-copying)
        self._pending_bytes = 0
        self.max_bytes = max_bytes or MAX_LINE_BYTES
        self.arrived = 0.0  # perf_counter() time the bytes that completed the last lines arrived

    async def next_lines(self) -> list[bytes] | None:
        """The lines that the next read completes (without their b"\\n"); None at the end of the body."""
        while True:
            data = await self._stream.readany()
            # The lines' time is their bytes' arrival, read before any splitting or parsing.
            self.arrived = self._clock()
            if not data:
                tail = b"".join(self._pending)
                self._pending, self._pending_bytes = [], 0
                return [tail] if tail else None
            if b"\n" not in data:
                self._hold(data)
                continue
            if self._pending:
                data = b"".join(self._pending) + data
                self._pending, self._pending_bytes = [], 0
            *lines, tail = data.split(b"\n")
            if tail:
                self._hold(tail)
            return lines

    async def read_all(self) -> bytes:
        """The whole body, held to `max_bytes` like one line (a non-streamed answer is one JSON text)."""
        while data := await self._stream.readany():
            self._hold(data)
        body = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return body

    def _hold(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes > self.max_bytes:
            raise ResponseError(f"a stream line over {self.max_bytes} bytes")


def chunk_text(chunk: dict) -> str:
    """The text a stream chunk adds: its first choice's delta content (chat) or text (completions)."""
    choices = chunk.get("choices")
    if not choices:
        return ""
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ResponseError(f"malformed chunk: choices is not a list of objects: {str(choices)[:100]}")
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        if not isinstance(delta, dict):
            raise ResponseError(f"malformed chunk: delta is not an object: {str(delta)[:100]}")
        text = delta.get("content")
        if not text and delta.get("tool_calls"):
            text = tool_call_text(delta["tool_calls"])
    else:
        text = choice.get("text")
    if text is None or isinstance(text, str):
        return text or ""
    raise ResponseError(f"malformed chunk: content is not a string: {str(text)[:100]}")


def tool_call_text(calls: object) -> str:
    """The text a streamed tool-call delta adds (function names and argument pieces): an answer that is
    a tool call is output like any other, timed from its first piece."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ResponseError(f"malformed chunk: tool_calls is not a list of objects: {str(calls)[:100]}")
    parts = []
    for call in calls:
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise ResponseError(f"malformed chunk: a tool call's function is no object: {str(function)[:80]}")
        parts += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    return "".join(parts)


def parse_chunk(data: bytes) -> tuple[str, dict | None, str | None]:
    """(text, usage, finish reason) of one `data:` payload; ResponseError for an error chunk or one that
    is malformed."""
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise ResponseError(f"malformed chunk: not JSON ({exc}): {data[:100]!r}") from None
    if not isinstance(chunk, dict):
        raise ResponseError(f"malformed chunk: not a JSON object: {data[:100]!r}")
    if chunk.get("error"):
        raise ResponseError(f"stream error: {error_message(json.dumps(chunk))}")
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise ResponseError(f"malformed chunk: usage is not an object: {str(usage)[:100]}")
    return chunk_text(chunk), usage, finish_reason(chunk)


def finish_reason(answer: dict) -> str | None:
    """The first choice's finish_reason, where a chunk or answer has one."""
    choices = answer.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        return None
    reason = choices[0].get("finish_reason")
    return reason if isinstance(reason, str) else None


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    req: BenchRequest,
    index: int,
    t0: float,
    count_tokens: Callable[[str], int] | None = None,
) -> RequestRecord:
    """Send one streamed request and time it. Never raises: the record says what went wrong.
    `count_tokens(text)` counts output tokens when the server gives no usage.

    A request that failed after any byte of its response arrived is never sent again: it was served (and
    counted there), so a re-send would measure two requests as one. One that failed before (NEVER_ANSWERED)
    is sent once more on a fresh connection, timed from that send, and counted in `reconnects`."""
    record = RequestRecord(index=index, prompt_tokens=req.prompt_tokens)
    try:
        await _exchange(session, target, req, record, t0, count_tokens)
    except WireError as exc:
        record.error = str(exc)
    except TimeoutError as exc:
        record.error = f"timeout: nothing received for {target.timeout_s:g} s ({describe(exc)})"
    except Exception as exc:  # noqa: BLE001 - whatever one response does costs that request, not the point
        record.error = describe(exc)
    if record.error is not None:
        record.success = False
        record.error = redact_text(record.error, target.api_key)  # a server may echo the key it got
    return record


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _exchange(
    session: aiohttp.ClientSession,
    target: Target,
    req: BenchRequest,
    record: RequestRecord,
    t0: float,
    count_tokens: Callable[[str], int] | None,
) -> None:
    """One request, its answer read into `record`; a failure raises (see `send`)."""
    payload = target.payload(req)
    # Serialized before the clock starts: building the body is the client's work, not the server's time.
    body, headers = json.dumps(payload).encode(), target.headers()
    async with contextlib.AsyncExitStack() as stack:
        stamp = SendStamp()
        try:
            resp = await session.post(target.url, data=body, headers=headers, trace_request_ctx=stamp)
        except NEVER_ANSWERED as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):  # no connection at all: not a stale one
                raise
            fresh = await stack.enter_async_context(fresh_session(session))
            record.reconnects += 1
            stamp = SendStamp()
            resp = await fresh.post(target.url, data=body, headers=headers, trace_request_ctx=stamp)
        sent = stamp.sent
        record.start = sent - t0
        await stack.enter_async_context(resp)
        record.status = resp.status
        if resp.status != 200:
            body = (await resp.content.read(ERROR_BODY_BYTES)).decode(errors="replace")
            raise ResponseError(f"HTTP {resp.status}: {error_message(body)}")
        if target.stream and target.api in ("chat", "completions"):
            lines = LineReader(resp.content, arrival_clock(resp))
            text_parts, usage = await _read_stream(lines, record, sent)
        elif target.stream:
            lines = LineReader(resp.content, arrival_clock(resp))
            text_parts, usage = await _read_events(lines, record, sent, event_reader(target.api))
        elif target.api in ("chat", "completions"):
            text_parts, usage = await _read_whole(resp, record, sent)
        else:
            text_parts, usage = await _read_whole_answer(resp, record, sent, target.api)
    record.e2e = time.perf_counter() - sent
    record.text = "".join(text_parts)
    if usage:
        apply_usage(record, usage)
    if record.ttft is None:
        raise ResponseError("no content received")
    await fill_counts(session, target.chat_payload(req), usage, record, count_tokens, len(text_parts))
    if req.response_format:
        record.structured = structured_outcome(req.response_format, record.text, record.finish_reason)
    record.success = True


def fresh_session(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """A session of one new connection, with `session`'s timeouts: the pool may hold more connections
    the server has closed, and a re-send must not meet another."""
    return timed_session(session.timeout, aiohttp.TCPConnector(force_close=True))


@dataclass
class SendStamp:
    """When a request went out: set as its body is handed to the socket (headers go with it), so a
    request's clock starts where the server's does. aiohttp writes a body in a task of its own (eagerly
    only from Python 3.12), which a loop busy with other streams runs after every callback already
    queued: timed from before session.post, a request's TTFT counted that wait as the server's."""

    sent: float = field(default_factory=time.perf_counter)  # until the body is written: the call itself


async def _on_body_sent(session, context, params) -> None:
    stamp = context.trace_request_ctx
    if isinstance(stamp, SendStamp):
        stamp.sent = time.perf_counter()


def arrival_clock(resp: aiohttp.ClientResponse) -> Callable[[], float]:
    """When the response's connection last received bytes: its protocol's data_received, stamped as the
    event loop hands them over, before the reading coroutine's turn comes (at 64 streams that turn came
    0.5 ms later at the median: TTFT error +1.61 -> +1.06 ms against the accuracy stub). The stamp wraps
    the connection's protocol object once; the connection is ours (the pool keeps it for our requests).
    Without a connection (the answer already read) the clock is the time of reading."""
    protocol = resp.connection.protocol if resp.connection is not None else None
    if protocol is None:
        return time.perf_counter
    arrived = getattr(protocol, "llmopt_arrived", None)
    if arrived is None:
        arrived = protocol.llmopt_arrived = [time.perf_counter()]
        received = protocol.data_received

        def stamped(data: bytes) -> None:
            arrived[0] = time.perf_counter()
            received(data)

        protocol.data_received = stamped
    return lambda: arrived[0]


def timed_session(timeout: aiohttp.ClientTimeout, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    """A session whose requests stamp their SendStamp (trace_request_ctx) when their body is sent."""
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_body_sent)
    return aiohttp.ClientSession(timeout=timeout, connector=connector, trace_configs=[trace])


async def fill_counts(
    session: aiohttp.ClientSession,
    payload: dict,
    usage: dict | None,
    record: RequestRecord,
    count_tokens: Callable[[str], int] | None,
    chunks: int,
) -> None:
    """The counts `usage` left out, from the server's /tokenize when `count_tokens` is a TokenCounter
    with one, else from the local tokenizer (the workload's prompt count; the output's, or its number of
    chunks without a tokenizer). `record.tokens_from` names the least exact source used."""
    need_prompt = not usage or usage.get("prompt_tokens") is None
    need_output = not usage or usage.get("completion_tokens") is None
    if not (need_prompt or need_output):
        record.tokens_from = "usage"
        return
    server = count_tokens if isinstance(count_tokens, TokenCounter) else None
    local = count_tokens if server is None or server.local is not None else None
    sources = set()
    if need_prompt:
        counted = await server.server_count(session, prompt_body(payload)) if server else None
        if counted is not None:
            record.prompt_tokens = counted
        sources.add("local" if counted is None else "tokenize")
    if need_output:
        counted = await server.server_count(session, output_body(record.text or "")) if server else None
        sources.add("local" if counted is None else "tokenize")
        if counted is None:
            counted = local(record.text or "") if local else chunks
        record.output_tokens = counted
    record.tokens_from = "local" if "local" in sources else "tokenize"


def _answer_object(body: bytes) -> dict:
    """A non-streamed answer's body as its JSON object; ResponseError when it is none."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise ResponseError(f"malformed answer: not JSON ({exc}): {body[:100]!r}") from None
    if not isinstance(answer, dict):
        raise ResponseError(f"malformed answer: not a JSON object: {body[:100]!r}")
    return answer


async def _read_whole(
    resp: aiohttp.ClientResponse, record: RequestRecord, sent: float
) -> tuple[list[str], dict | None]:
    """A non-streamed answer: its text and usage. Its first token arrives with its last, so TTFT is E2E."""
    body = await LineReader(resp.content).read_all()
    answer = _answer_object(body)
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ResponseError(f"malformed answer: no choices: {body[:100]!r}")
    message = choices[0].get("message")
    # A whole chat message reads like one stream delta (content, or tool calls), a completion like a chunk.
    text = chunk_text({"choices": [{"delta": message} if message is not None else choices[0]]})
    usage = answer.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise ResponseError(f"malformed answer: usage is not an object: {str(usage)[:100]}")
    record.finish_reason = finish_reason(answer)
    if text:
        record.ttft = time.perf_counter() - sent
    return [text], usage


async def _read_stream(
    lines: LineReader, record: RequestRecord, sent: float
) -> tuple[list[str], dict | None]:
    """Read the SSE stream to its `data: [DONE]`, timing each content chunk into `record`; return the
    chunks' texts and the last usage seen."""
    text_parts: list[str] = []
    usage = None
    last = sent
    while (batch := await lines.next_lines()) is not None:
        for line in batch:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return text_parts, usage
            text, chunk_usage, reason = parse_chunk(data)
            if chunk_usage:
                usage = chunk_usage
            if reason:
                record.finish_reason = reason
            if not text:
                continue
            now = lines.arrived  # not after parsing: a chunk's JSON is the client's work
            if record.ttft is None:
                record.ttft = now - sent
            else:
                record.itl.append(now - last)
            last = now
            text_parts.append(text)
    raise ResponseError("stream ended without [DONE]")


def apply_usage(record: RequestRecord, usage: dict) -> None:
    """The server's token counts into `record`; a count left out (or null) is counted by fill_counts."""
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        raise ResponseError(f"malformed usage: prompt_tokens_details is not an object: {str(details)[:100]}")
    counts = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "disk_cached_tokens": details.get("disk_cached_tokens"),
    }
    for name, value in counts.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ResponseError(f"malformed usage: {name} is not a count: {str(value)[:100]}")
    if counts["prompt_tokens"] is not None:
        record.prompt_tokens = counts["prompt_tokens"]
    record.cached_tokens = counts["cached_tokens"]
    record.disk_cached_tokens = counts["disk_cached_tokens"]
    if counts["completion_tokens"] is not None:  # else fill_counts counts it
        record.output_tokens = counts["completion_tokens"]
    written = details.get("cache_write_tokens")
    if isinstance(written, int) and not isinstance(written, bool):
        record.cache_write_tokens = written


def error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
        return error.get("message", str(error)) if isinstance(error, dict) else str(error or body)
    except (ValueError, AttributeError):
        return body[:200]


def event_reader(api: str) -> Callable[[dict], WireEvent]:
    """A reader of one streamed answer's events of `api` (responses or messages)."""
    return responses_event if api == "responses" else MessagesStream().event


async def _read_events(
    lines: LineReader, record: RequestRecord, sent: float, read: Callable[[dict], WireEvent]
) -> tuple[list[str], dict | None]:
    """Read a Responses or Messages stream to its last event (`response.completed`, `message_stop`),
    timing each event that adds text as chat's content chunks are timed; return the texts and the
    usage. Both APIs' events carry their type in their data, so `event:` lines are skipped."""
    text_parts: list[str] = []
    usage = None
    last = sent
    while (batch := await lines.next_lines()) is not None:
        for line in batch:
            if not line.startswith(b"data:"):
                continue
            try:
                data = json.loads(line[5:])
            except ValueError as exc:
                raise ResponseError(f"malformed event: not JSON ({exc}): {line[:100]!r}") from None
            if not isinstance(data, dict):
                raise ResponseError(f"malformed event: not a JSON object: {line[:100]!r}")
            event = read(data)
            usage = event.usage or usage
            record.finish_reason = event.finish_reason or record.finish_reason
            record.response_id = event.response_id or record.response_id
            if event.text:
                now = lines.arrived  # not after parsing: an event's JSON is the client's work
                if record.ttft is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last)
                last = now
                text_parts.append(event.text)
            if event.done:
                return text_parts, usage
    raise ResponseError("stream ended before its last event")


async def _read_whole_answer(
    resp: aiohttp.ClientResponse, record: RequestRecord, sent: float, api: str
) -> tuple[list[str], dict | None]:
    """A non-streamed Responses or Messages answer: its text and usage (TTFT is its E2E)."""
    body = await LineReader(resp.content).read_all()
    answer = _answer_object(body)
    whole = responses_whole(answer) if api == "responses" else messages_whole(answer)
    record.finish_reason, record.response_id = whole.finish_reason, whole.response_id
    if whole.text:
        record.ttft = time.perf_counter() - sent
    return [whole.text], whole.usage
