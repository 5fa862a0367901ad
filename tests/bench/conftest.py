"""Fixtures for the bench's fast tier: a tokenizer folder made here (no model weights, no config.json)
and a scripted OpenAI-compatible endpoint on 127.0.0.1 (no model, no llmopt server)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmopt.corpus import default_text


def save_word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer of the default corpus, saved as transformers saves one: tokenizer.json and
    tokenizer_config.json, nothing else. Every corpus word is in its vocabulary, so the workloads can
    cut prompts of an exact token length from the corpus with it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        default_text().splitlines(), trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_word_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tok")


# A scripted answer to one completion request: writes the whole response (or none) to the handler.
Reply = Callable[["ScriptedOpenAI", dict], None]


class ScriptedOpenAI(http.server.BaseHTTPRequestHandler):
    """A stand-in for an OpenAI-compatible server: /v1/models lists one model, and both completion
    routes stream `max_tokens` one-word chunks, then the usage. Every request's path and body is kept
    in `seen` and its Authorization header in `auth`, so a test can check what the bench sent. A test
    that puts replies in `replies` gets each next request answered by the next of them instead (bad
    servers: see `sse`, `hang_up`, `stall`, `answer`). A request with `stream: false` gets a whole JSON
    answer; /reset_prefix_cache answers the endpoint's `reset_status` and is counted in its `resets`."""

    seen: list[tuple[str, dict]]
    auth: list[str | None]
    replies: list[Reply]
    endpoint: Endpoint  # its `resets` and `reset_status`: the /reset_prefix_cache route
    released: threading.Event  # set when the endpoint shuts down: a stalled reply then ends

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        page = self.endpoint.metrics
        if self.path == "/metrics" and page is not None:  # a Prometheus page, when the test gives one
            body, kind = page().encode(), "text/plain; version=0.0.4"
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
            kind = "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":  # kept apart too
            if not self.endpoint.tokenize:
                self.send_error(404)
                return
            self.endpoint.tokenized.append(request)
            tokenized(self, request)
            return
        if self.path == "/reset_prefix_cache":  # kept apart: `seen` holds completion requests only
            self.endpoint.resets.append(self.headers.get("Authorization"))
            self.send_response(self.endpoint.reset_status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.seen.append((self.path, request))
        self.auth.append(self.headers.get("Authorization"))
        if self.path not in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
            self.send_error(404)
            return
        if self.replies:
            self.replies.pop(0)(self, request)
            return
        if self.path in NEWER_APIS:
            NEWER_APIS[self.path](self, request)
            return
        if self.endpoint.capacity is not None:
            self.endpoint.capacity.serve()
        chat = self.path == "/v1/chat/completions"
        if request.get("stream") is False:
            whole(self, request, chat)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(request["max_tokens"]):
            choice = {"index": 0, "delta": {"content": "word "}} if chat else {"index": 0, "text": "word "}
            self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 10, "completion_tokens": request["max_tokens"]}
        if self.endpoint.usage:
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


def whole(handler: ScriptedOpenAI, request: dict, chat: bool) -> None:
    """A non-streamed answer of `max_tokens` words, with its usage."""
    text = "word " * request["max_tokens"]
    choice = (
        {"index": 0, "message": {"role": "assistant", "content": text}}
        if chat
        else {"index": 0, "text": text}
    )
    usage = {"prompt_tokens": 10, "completion_tokens": request["max_tokens"]}
    body = json.dumps({"choices": [choice], **({"usage": usage} if handler.endpoint.usage else {})}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def responses_answer(handler: ScriptedOpenAI, request: dict) -> None:
    """The Responses API's answer of `max_output_tokens` words (events, or a whole response object), its
    usage saying 4 cached tokens, its id numbered by the request's place in `seen`."""
    words = request["max_output_tokens"]
    response = {
        "id": f"resp_{len(handler.seen)}",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "word " * words}],
            }
        ],
        "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": words},
    }
    if request.get("stream") is False:
        json_answer(handler, response)
        return
    event_stream(handler)
    events = [{"type": "response.created", "response": {**response, "status": "in_progress", "output": []}}]
    events += [{"type": "response.output_text.delta", "delta": "word "} for _ in range(words)]
    events.append({"type": "response.completed", "response": response})
    for event in events:
        handler.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())


def messages_answer(handler: ScriptedOpenAI, request: dict) -> None:
    """Anthropic's answer of `max_tokens` words: 3 prompt tokens uncached, 5 read from the cache and 2
    written to it."""
    words = request["max_tokens"]
    usage = {"input_tokens": 3, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}
    message = {"id": f"msg_{len(handler.seen)}", "type": "message", "role": "assistant", "content": []}
    if request.get("stream") is False:
        text = [{"type": "text", "text": "word " * words}]
        json_answer(
            handler,
            {
                **message,
                "content": text,
                "stop_reason": "end_turn",
                "usage": {**usage, "output_tokens": words},
            },
        )
        return
    event_stream(handler)
    events = [
        {
            "type": "message_start",
            "message": {**message, "usage": {**usage, "input_tokens": 10, "output_tokens": 1}},
        }
    ]
    events.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "word "}}
    ] * words
    events.append({"type": "content_block_stop", "index": 0})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {**usage, "output_tokens": words},
        }
    )
    events.append({"type": "message_stop"})
    for event in events:
        handler.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())


NEWER_APIS = {"/v1/responses": responses_answer, "/v1/messages": messages_answer}


def json_answer(handler: ScriptedOpenAI, answer: dict) -> None:
    body = json.dumps(answer).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def tokenized(handler: ScriptedOpenAI, request: dict) -> None:
    """/tokenize in vLLM's shape, 3 tokens a word (of the prompt, or of every message's content), so
    that a test tells its counts from a word tokenizer's."""
    text = request.get("prompt") or " ".join(m["content"] for m in request.get("messages", []))
    tokens = list(range(3 * len(text.split())))
    body = json.dumps({"count": len(tokens), "max_model_len": 2048, "tokens": tokens}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def event_stream(handler: ScriptedOpenAI) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()


def content(text: str) -> bytes:
    """A chat stream chunk that adds `text`."""
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode()


def sse(*payloads: bytes, done: bool = True) -> Reply:
    """A 200 stream of `data: PAYLOAD` events, ended by `data: [DONE]` unless `done` is False."""

    def reply(handler: ScriptedOpenAI, request: dict) -> None:
        event_stream(handler)
        for payload in payloads + ((b"[DONE]",) if done else ()):
            handler.wfile.write(b"data: " + payload + b"\n\n")

    return reply


def hang_up(handler: ScriptedOpenAI, request: dict) -> None:
    """Read the request, then close the connection without a word: a server that closed a kept-alive
    connection (or crashed) before answering. No byte of an answer came, so the request never ran: the
    bench sends it once more on a fresh connection."""


def stall(gap_s: float = 0.0, chunks: int = 1, then_stop: bool = True) -> Reply:
    """`chunks` content chunks `gap_s` apart, then (`then_stop`) nothing until the endpoint shuts down,
    or else the end of a whole stream."""

    def reply(handler: ScriptedOpenAI, request: dict) -> None:
        event_stream(handler)
        for _ in range(chunks):
            handler.wfile.write(b"data: " + content("word ") + b"\n\n")
            handler.wfile.flush()
            time.sleep(gap_s)
        if then_stop:
            handler.released.wait(60)
        else:
            handler.wfile.write(b"data: [DONE]\n\n")

    return reply


def answer(status: int, body: str) -> Reply:
    """A plain (not streamed) answer: an error status with its body."""

    def reply(handler: ScriptedOpenAI, request: dict) -> None:
        data = body.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return reply


class Capacity:
    """A server of known capacity: at most `slots` requests served at once, each for `service_s` before
    its answer streams (at once), so that it completes `rate` = slots / service_s requests per second and
    a request beyond the slots waits for one: asked for more than `rate`, its queue grows."""

    def __init__(self, slots: int, service_s: float):
        self.slots, self.service_s = slots, service_s
        self._free = threading.BoundedSemaphore(slots)

    @property
    def rate(self) -> float:
        return self.slots / self.service_s

    def serve(self) -> None:
        with self._free:
            time.sleep(self.service_s)


@dataclass
class Endpoint:
    url: str  # the API base, .../v1
    seen: list[tuple[str, dict]]  # (path, body) of every completion request, in arrival order
    auth: list[str | None] = field(default_factory=list)  # their Authorization headers
    replies: list[Reply] = field(default_factory=list)  # scripted answers to the next requests
    resets: list[str | None] = field(default_factory=list)  # each /reset_prefix_cache call's Authorization
    reset_status: int = 404  # what /reset_prefix_cache answers (404: no such route, as on most servers)
    metrics: Callable[[], str] | None = None  # GET /metrics answers this page (None: 404, as most servers)
    usage: bool = True  # False: answers carry no `usage`, as some servers' do not
    tokenize: bool = False  # True: POST /tokenize counts (see `tokenized`); False: 404, as most servers
    tokenized: list[dict] = field(default_factory=list)  # the body of every /tokenize call
    capacity: Capacity | None = None  # a limit on what it serves at once (None: everything at once)


@pytest.fixture
def openai_endpoint() -> Iterator[Endpoint]:
    endpoint = Endpoint("", [])
    released = threading.Event()
    shared = {
        "seen": endpoint.seen,
        "auth": endpoint.auth,
        "replies": endpoint.replies,
        "released": released,
        "endpoint": endpoint,
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (ScriptedOpenAI,), shared))
    # Polled often, so that shutting it down after each test takes no half second.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield endpoint
    finally:
        released.set()
        server.shutdown()
        server.server_close()
