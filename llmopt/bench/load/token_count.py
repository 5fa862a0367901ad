"""Token counts for a request whose answer carried no (or no whole) `usage`: the server's own /tokenize
(vLLM's and llmopt's route at the server's root: {"model", "prompt" | "messages"} -> {"count", "tokens",
...}), else the local tokenizer. So the bench's counts come from `usage` when the server gives it, else
from /tokenize, else from the local tokenizer, and a record's `tokens_from` says which (TOKEN_SOURCES).

/tokenize is asked once per distinct text and point, after the request's timing has ended, so it adds
no latency to the request it counts (only the slot it holds waits for the count). A server that answers
it with anything but a count is not asked again during the point."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

# Most exact first: a summary's `token_source` is the least exact its records used.
TOKEN_SOURCES = ("usage", "tokenize", "local")


def tokenize_url(endpoint: str) -> str:
    """Where /tokenize is for an API base: at the server's root (`.../v1` dropped), as vLLM and llmopt
    serve it."""
    base = endpoint.rstrip("/")
    return (base[: -len("/v1")] if base.endswith("/v1") else base) + "/tokenize"


@dataclass
class TokenCounter:
    """Counts tokens: `counter(text)` with the local tokenizer (what the load loops pass around as
    `count_tokens`), `await counter.server_count(...)` with the server's /tokenize."""

    local: Callable[[str], int] | None = None
    url: str | None = None  # the server's /tokenize; None: never ask it
    model: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    available: bool | None = None  # None: not asked yet; False: it gave no count, ask no more
    counts: dict[str, int] = field(default_factory=dict)  # by a digest of the asked body

    def __call__(self, text: str) -> int:
        assert self.local is not None, "no local tokenizer to count with"
        return self.local(text)

    async def server_count(self, session: aiohttp.ClientSession, body: dict) -> int | None:
        """The server's count of `body` ({"prompt": ...} or {"messages": ...}), None if it gives none."""
        if self.url is None or self.available is False:
            return None
        key = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if key in self.counts:
            return self.counts[key]
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with session.post(
                self.url, json={"model": self.model, **body}, headers=self.headers, timeout=timeout
            ) as resp:
                answer = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            answer = None
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            self.available = False
            return None
        self.available = True
        self.counts[key] = count
        return count


def prompt_body(payload: dict) -> dict:
    """What /tokenize counts as a request's prompt: its chat messages (and tools: the chat template
    renders both, as the server's `usage.prompt_tokens` counts them) or its completion prompt."""
    if "messages" in payload:
        body = {"messages": payload["messages"]}
        if payload.get("tools"):
            body["tools"] = payload["tools"]
        return body
    return {"prompt": payload["prompt"]}


def output_body(text: str) -> dict:
    return {"prompt": text, "add_special_tokens": False}
