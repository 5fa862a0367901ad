"""Who may call the server, and who owns what it stores. With `--api-key` every route takes the key but
the probes' and the schema's (`OPEN_PATHS`): generation, the tokenizer routes, stored responses and the
admin route that flushes every session's cached prefix. The key comes as OpenAI's `Authorization:
Bearer KEY` or Anthropic's `x-api-key: KEY`."""

from __future__ import annotations

import hashlib
import hmac

from llmopt.server.error_bodies import APIError

# /health and /metrics for probes and scrapers; the OpenAPI schema and its pages describe routes and hold
# no data (schemathesis reads the schema without a key).
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def presented_key(headers: dict[bytes, bytes]) -> bytes:
    """The key a request shows (ASGI headers, lower-case names): a bearer token, else x-api-key."""
    authorization = headers.get(b"authorization", b"")
    if authorization[:7].lower() == b"bearer ":
        return authorization[7:].strip()
    return headers.get(b"x-api-key", b"").strip()


def owner_of(headers: dict[bytes, bytes]) -> str:
    """Whose stored data a request may read: a hash of the key it shows (never the key itself, which a
    memory dump or a debugger would then show). Without a server key this still keeps clients that use
    different keys apart."""
    return hashlib.sha256(presented_key(headers)).hexdigest()


class APIKeyCheck:
    """ASGI middleware asking every request but OPEN_PATHS for the key (before routing: an unknown route
    answers 401 to a caller without the key, telling it nothing about which routes exist). Plain ASGI,
    not Starlette's BaseHTTPMiddleware: that one hands every chunk of a stream through a memory stream and
    a task of its own, event-loop work per token at every concurrency."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = presented_key(dict(scope["headers"]))
        if not hmac.compare_digest(given, self.expected):  # constant time: no timing leak
            error = APIError(
                401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
            )
            return await error.response(scope["path"])(scope, receive, send)
        return await self.app(scope, receive, send)
