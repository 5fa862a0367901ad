"""The server's edge without a model: every 4xx and 5xx in OpenAI's error shape (Anthropic's on
/v1/messages), unknown routes and wrong methods included; the API key on every route but the probes',
as a bearer token or x-api-key; the access log's line per request and its request id; the admin route
turned off. A small FastAPI app wired as create_app wires the real one."""

from __future__ import annotations

import hashlib
import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from llmopt.server.access_log import AccessLog, request_id_of
from llmopt.server.auth import OPEN_PATHS, APIKeyCheck, owner_of, presented_key
from llmopt.server.error_bodies import APIError, install_error_handlers
from llmopt.server.routes import build_router
from llmopt.server.settings import ServerSettings

KEY = "edge-key"


class Body(BaseModel):
    n: int


def edge_app(api_key: str | None = KEY, log_requests: bool = True) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(APIKeyCheck, api_key=api_key)
    app.add_middleware(AccessLog, enabled=log_requests)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(body: Body) -> dict:
        return {"n": body.n}

    @app.post("/v1/messages")
    async def messages(body: Body) -> dict:
        raise APIError(400, "max_tokens: too many", param="max_tokens")

    @app.get("/v1/boom")
    async def boom() -> dict:
        raise RuntimeError("a bug")

    return app


@pytest.fixture
def http() -> TestClient:
    return TestClient(edge_app(), raise_server_exceptions=False)


BEARER = {"Authorization": f"Bearer {KEY}"}


def test_unknown_routes_and_wrong_methods_answer_in_openais_error_shape(http):
    r = http.get("/v1/nope", headers=BEARER)
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "Invalid URL (GET /v1/nope)",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
    r = http.get("/v1/chat/completions", headers=BEARER)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed" and "use POST" in r.json()["error"]["message"]


def test_validation_errors_and_bugs_answer_in_openais_shape(http):
    r = http.post("/v1/chat/completions", headers=BEARER, json={"n": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = http.post("/v1/chat/completions", headers={**BEARER, "Content-Type": "application/json"}, content="{")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = http.get("/v1/boom", headers=BEARER)
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error" and "a bug" not in r.text  # no internals leak


def test_anthropics_route_answers_in_anthropics_error_shape(http):
    r = http.post("/v1/messages", headers=BEARER, json={"n": 1})
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too many"},
    }
    r = http.post("/v1/messages", json={"n": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["type"] == "error"
    r = http.get("/v1/messages/nope", headers=BEARER)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_the_key_is_taken_as_a_bearer_token_or_x_api_key_on_every_route_but_the_open_ones(http):
    for headers in (BEARER, {"x-api-key": KEY}, {"authorization": f"bearer {KEY}"}):
        assert http.post("/v1/chat/completions", headers=headers, json={"n": 1}).json() == {"n": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": KEY}):
        r = http.post("/v1/chat/completions", headers=headers, json={"n": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # An unknown route answers 401 to a caller without the key: it learns nothing of which routes exist.
    assert http.get("/reset_prefix_cache").status_code == 401
    assert http.get("/health").status_code == 200
    assert {"/health", "/metrics", "/openapi.json"} <= OPEN_PATHS and "/tokenize" not in OPEN_PATHS


def test_owners_are_told_apart_by_the_key_they_show_never_by_the_key_itself():
    mine, theirs = {b"authorization": b"Bearer a"}, {b"x-api-key": b"b"}
    assert presented_key(mine) == b"a" and presented_key(theirs) == b"b"
    assert owner_of(mine) == owner_of({b"x-api-key": b"a"}) != owner_of(theirs)
    assert owner_of(mine) == hashlib.sha256(b"a").hexdigest()  # a hash: the key itself is never kept


def test_every_request_is_logged_once_with_its_request_id(caplog):
    http = TestClient(edge_app(), raise_server_exceptions=False)
    with caplog.at_level(logging.INFO, logger="llmopt.access"):
        r = http.post(
            "/v1/chat/completions?secret=1", headers={**BEARER, "X-Request-Id": "req-42"}, json={"n": 2}
        )
        unauthorized = http.post("/v1/chat/completions", json={"n": 2})
        http.get("/v1/boom", headers=BEARER)
    assert r.headers["x-request-id"] == "req-42"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "llmopt.access"]
    assert len(lines) == 3
    assert '"POST /v1/chat/completions" 200' in lines[0] and lines[0].endswith("request_id=req-42")
    assert "secret" not in lines[0]  # the query string stays out of the log
    assert '" 401 ' in lines[1] and unauthorized.headers["x-request-id"] in lines[1]
    assert '"GET /v1/boom" 500' in lines[2]
    assert " ms request_id=" in lines[0]


def test_disable_log_requests_writes_no_line_but_keeps_the_request_id(caplog):
    http = TestClient(edge_app(log_requests=False))
    with caplog.at_level(logging.INFO, logger="llmopt.access"):
        r = http.post("/v1/chat/completions", headers=BEARER, json={"n": 2})
    assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32
    assert [rec for rec in caplog.records if rec.name == "llmopt.access"] == []


def test_a_request_id_that_could_forge_a_log_line_is_replaced():
    assert request_id_of({b"x-request-id": b"ok-1"}) == "ok-1"
    for bad in (b"a\nb", b"x" * 200, b"", "é".encode()):
        replaced = request_id_of({b"x-request-id": bad})
        assert replaced != bad.decode(errors="replace") and len(replaced) == 32


def test_admin_routes_can_be_turned_off():
    def paths(**flags) -> set[str]:
        settings = ServerSettings("m", None, 2**20, **flags)
        return {route.path for route in build_router(None, None, None, settings).routes}

    assert "/reset_prefix_cache" in paths()
    off = paths(disable_admin_routes=True)
    assert "/reset_prefix_cache" not in off and {"/v1/responses", "/v1/messages", "/tokenizer_info"} <= off


def test_the_served_app_logs_each_request_unless_told_not_to(caplog):
    from types import SimpleNamespace

    from llmopt.server.app import create_app

    stopped = SimpleNamespace(engine=None, healthy=False, failure="stopped")  # no engine: /health answers
    for disabled in (False, True):
        caplog.clear()
        settings = ServerSettings("m", None, 2**20, disable_log_requests=disabled)
        http = TestClient(create_app(stopped, settings))  # no lifespan: the engine is never started
        with caplog.at_level(logging.INFO, logger="llmopt.access"):
            assert http.get("/health").status_code == 503
        lines = [rec.getMessage() for rec in caplog.records if rec.name == "llmopt.access"]
        assert len(lines) == (0 if disabled else 1), lines
