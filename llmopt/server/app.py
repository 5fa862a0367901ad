"""The OpenAI-compatible HTTP API over the engine, wired together: the engine steps on its own thread
(EngineThread) for the app's lifetime, /v1 sits behind the API key, errors answer in OpenAI's shape,
and the routes (routes.py) do the rest."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from llmopt.engine.engine_thread import EngineThread
from llmopt.server.errors import APIError, api_error_handler, request_validation_error_handler
from llmopt.server.metrics import ServerMetrics
from llmopt.server.routes import build_router
from llmopt.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def create_app(engine_thread: EngineThread, settings: ServerSettings) -> FastAPI:
    """The API over `engine_thread`, which the app's lifespan starts (if the caller has not begun it)
    and stops."""
    engine = engine_thread.engine
    metrics = ServerMetrics(engine, settings.served_model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine_thread.start()
        yield
        engine_thread.shutdown()

    app = FastAPI(title="llmopt", lifespan=lifespan)
    app.state.engine_thread = engine_thread  # serve.py's signal handler ends running requests through it
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, request_validation_error_handler)
    app.add_middleware(APIKeyCheck, api_key=settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.include_router(build_router(engine, engine_thread, metrics, settings))
    return app


class BodyLimit:
    """ASGI middleware answering 413 to a request body over `max_bytes`: at once when Content-Length
    says so; a chunked body is read up to the limit first (so at most `max_bytes` are ever held) and
    handed on whole, since the route's own body reading turns any error into a 400."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                return await self.too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left while sending
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self.too_large(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # what follows the body: the disconnect message
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def too_large(self, scope, receive, send) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        error = APIError(413, message, code="body_too_large")
        await error.response()(scope, receive, send)


class APIKeyCheck:
    """ASGI middleware asking /v1 requests for the key; /health and /metrics stay open for probes and
    scrapers. Plain ASGI, not Starlette's BaseHTTPMiddleware: that one hands every chunk of a stream
    through a memory stream and a task of its own, event-loop work per token at every concurrency."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if self.expected is None or scope["type"] != "http" or not scope["path"].startswith("/v1"):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):  # constant time: no timing leak
            error = APIError(
                401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
            )
            return await error.response()(scope, receive, send)
        return await self.app(scope, receive, send)
