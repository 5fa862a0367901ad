"""Errors in OpenAI's shape ({"error": {message, type, param, code}}), for our own refusals and for
requests that fail validation."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


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

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def aborted_error(shutting_down: bool) -> APIError:
    """Why the engine ended a request early: a shutdown, or (a bug) a failed engine step."""
    if shutting_down:
        return APIError(503, "the server is shutting down; the request was not completed", "server_error")
    return APIError(500, "the engine failed while serving this request; see the server log", "server_error")


def request_failed(reason: str | None) -> APIError:
    """This request alone failed inside the engine (its sampling or stop check); the others go on."""
    return APIError(500, f"the engine failed on this request: {reason}", "server_error")


async def api_error_handler(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def request_validation_error_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers 422 with its own body; OpenAI clients expect 400 naming the offending field."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}").response()
    where = ".".join(loc) or "body"
    # The top-level field is the param, as OpenAI names it; the message keeps the whole path.
    return APIError(400, f"{where}: {first.get('msg')}", param=loc[0] if loc else None).response()
