"""Async streaming client: one request, timed from the moment it is sent to its last byte.

Speaks only HTTP (OpenAI's /v1/completions and /v1/chat/completions with `stream: true`), so it
measures any compatible server: ours, vLLM, llama.cpp, a paid API.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import aiohttp


@dataclass
class BenchRequest:
    """One request of a workload. `prompt_tokens` is the local tokenizer's count."""

    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int = 128
    prompt_tokens: int = 0


@dataclass
class RequestRecord:
    """What one request measured (times in seconds; `start` is relative to the load point's start)."""

    index: int
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    tokens_from: str = "usage"  # "usage": the server's counts; "local": counted here
    status: int | None = None
    error: str | None = None
    success: bool = False

    def to_json(self, **extra) -> str:
        return json.dumps({**asdict(self), **extra})


@dataclass
class Target:
    endpoint: str  # base URL, e.g. http://127.0.0.1:8000/v1
    model: str
    api: str = "chat"  # "chat" or "completions"
    api_key: str | None = None
    ignore_eos: bool = True  # vLLM's extension; fixes output lengths where the server takes it
    timeout_s: float = 600.0

    @property
    def url(self) -> str:
        path = "/chat/completions" if self.api == "chat" else "/completions"
        return self.endpoint.rstrip("/") + path

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def payload(self, req: BenchRequest) -> dict:
        body: dict = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = req.messages or [{"role": "user", "content": req.prompt or ""}]
        else:
            body["prompt"] = req.prompt if req.prompt is not None else req.messages[-1]["content"]
        return body


STALE_CONNECTION_RETRIES = 4


def chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    req: BenchRequest,
    index: int,
    t0: float,
    count_tokens=None,
) -> RequestRecord:
    """Send one streamed request and time it. Never raises for an HTTP or network failure: the record
    says what went wrong. `count_tokens(text)` counts output tokens when the server gives no usage."""
    for attempt in range(STALE_CONNECTION_RETRIES + 1):
        try:
            return await _send_once(session, target, req, index, t0, count_tokens)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # A pooled keep-alive connection the server had already closed (llama.cpp's server closes
            # them after a few requests or seconds): nothing was received, so send again, timed afresh.
            if attempt == STALE_CONNECTION_RETRIES or isinstance(exc, aiohttp.ClientConnectorError):
                return failed_record(index, req, t0, exc)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return failed_record(index, req, t0, exc)
    raise AssertionError("unreachable")


def failed_record(index: int, req: BenchRequest, t0: float, exc: BaseException) -> RequestRecord:
    record = RequestRecord(index=index, prompt_tokens=req.prompt_tokens, start=time.perf_counter() - t0)
    record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return record


async def _send_once(
    session, target: Target, req: BenchRequest, index: int, t0: float, count_tokens
) -> RequestRecord:
    record = RequestRecord(index=index, prompt_tokens=req.prompt_tokens)
    text_parts: list[str] = []
    usage = None
    sent = time.perf_counter()
    record.start = sent - t0
    last = sent
    async with session.post(target.url, json=target.payload(req), headers=target.headers()) as resp:
        record.status = resp.status
        if resp.status != 200:
            body = await resp.text()
            record.error = f"HTTP {resp.status}: {error_message(body)}"
            return record
        try:
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = f"stream error: {error_message(json.dumps(chunk))}"
                    break
                usage = chunk.get("usage") or usage
                text = chunk_text(chunk)
                if not text:
                    continue
                now = time.perf_counter()
                if record.ttft is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last)
                last = now
                text_parts.append(text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # failed mid-stream: no retry
            record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return record
    record.e2e = time.perf_counter() - sent
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
        record.output_tokens = usage.get("completion_tokens", 0)
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    else:
        record.tokens_from = "local"
        text = "".join(text_parts)
        record.output_tokens = count_tokens(text) if count_tokens else len(text_parts)
    if record.ttft is None and record.error is None:
        record.error = "no content received"
    record.success = record.error is None
    return record


def error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
        return error.get("message", str(error)) if isinstance(error, dict) else str(error or body)
    except (ValueError, AttributeError):
        return body[:200]
