"""The OpenAI-compatible HTTP API over the engine, wired together: the engine steps on its own thread
(EngineThread) for the app's lifetime, every route but the probes' sits behind the API key (auth.py),
every error answers in OpenAI's shape (Anthropic's on its route: errors.py), each request is logged once
(access_log.py), and the routes (routes.py) do the rest."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from llmopt.engine.engine_thread import EngineThread
from llmopt.server.access_log import AccessLog
from llmopt.server.auth import APIKeyCheck
from llmopt.server.error_bodies import APIError, install_error_handlers
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
    install_error_handlers(app)
    # Added last, so outermost: the access log sees a 413 or a 401 too.
    app.add_middleware(APIKeyCheck, api_key=settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(AccessLog, enabled=not settings.disable_log_requests)
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
        await error.response(scope["path"])(scope, receive, send)
