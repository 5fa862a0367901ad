"""Errors in OpenAI's shape ({"error": {message, type, param, code}}) for every 4xx and 5xx the server
answers, our own refusals, requests that fail validation, unknown routes and wrong methods alike; on
Anthropic's route (/v1/messages) in Anthropic's shape ({"type": "error", "error": {type, message}}), which
the `anthropic` client reads its exceptions from."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ANTHROPIC_PREFIX = "/v1/messages"
# Anthropic's error types by status (docs.anthropic.com, "Errors"); any other 5xx is an api_error.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# OpenAI's error types by status, for errors the server raises without naming one.
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self, path: str = "") -> dict:
        """The error body for a request to `path`: Anthropic's shape on its route, else OpenAI's."""
        if speaks_anthropic(path):
            kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else self.type)
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, path: str = "", headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(path), status_code=self.status, headers=headers)


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def aborted_error(shutting_down: bool) -> APIError:
    """Why the engine ended a request early: a shutdown, or (a bug) a failed engine step."""
    if shutting_down:
        return APIError(503, "the server is shutting down; the request was not completed", "server_error")
    return APIError(500, "the engine failed while serving this request; see the server log", "server_error")


def request_failed(reason: str | None) -> APIError:
    """This request alone failed inside the engine (its sampling or stop check); the others go on."""
    return APIError(500, f"the engine failed on this request: {reason}", "server_error")


def renamed(error: APIError, names: dict[str, str]) -> APIError:
    """`error` with its param in another API's words (a translated request's field names)."""
    if error.param in names:
        error.param = names[error.param]
    return error


async def api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    return exc.response(request.url.path)


async def request_validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers 422 with its own body; OpenAI clients expect 400 naming the offending field."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    path = request.url.path
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}").response(path)
    where = ".".join(loc) or "body"
    # The top-level field is the param, as OpenAI names it; the message keeps the whole path.
    return APIError(400, f"{where}: {first.get('msg')}", param=loc[0] if loc else None).response(path)


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own 404 (no such route) and 405 (a route, another method) in the API's shape:
    `{"detail": "Not Found"}` is no error object to OpenAI's clients (pydantic-ai read it as "model not
    found"). A 405 keeps its Allow header."""
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        error = APIError(404, f"Invalid URL ({method} {path})", code="not_found")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{method} is not allowed on {path}" + (f"; use {allowed}" if allowed else "")
        error = APIError(405, message, code="method_not_allowed")
    else:
        error = APIError(exc.status_code, str(exc.detail), OPENAI_TYPES.get(exc.status_code, "server_error"))
    return error.response(path, exc.headers)


async def server_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """An exception no route turned into an answer (a bug): a 500 in the API's shape, the traceback in
    the log (Starlette logs it after this answer is sent)."""
    error = APIError(500, "the server failed on this request; see its log", "server_error")
    return error.response(request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, request_validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(Exception, server_error_handler)
