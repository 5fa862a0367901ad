"""Every registered route of the live server, with and without the key: each one that generates, reads
stored data, tokenizes or changes the server's state (/reset_prefix_cache) answers 401 without it;
only the probes' and the schema's routes are open. Unknown routes and wrong methods answer in OpenAI's
error shape, and each request leaves one access-log line with its request id."""

from __future__ import annotations

import re

import httpx

from llmopt.server.auth import OPEN_PATHS
from tests.conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def registered_routes(server) -> list[tuple[str, str]]:
    """(method, path) of every route in the server's OpenAPI schema, path parameters filled in."""
    schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "resp_none", path))
        for path, operations in schema["paths"].items()
        for method in operations
    ]


def call(server, method: str, path: str, headers: dict) -> httpx.Response:
    body = {} if method == "POST" else None
    return httpx.request(method, server.url + path, headers=headers, json=body, timeout=60)


def test_every_route_but_the_open_ones_takes_the_key(server):
    routes = registered_routes(server)
    paths = {path for _, path in routes}
    assert {"/v1/responses", "/v1/messages", "/tokenize", "/detokenize", "/tokenizer_info"} <= paths
    assert {"/reset_prefix_cache", "/v1/responses/resp_none", "/v1/messages/count_tokens"} <= paths
    for method, path in routes:
        without = call(server, method, path, {})
        with_key = call(server, method, path, HEADERS)
        if path in OPEN_PATHS:
            assert without.status_code == 200, (method, path, without.text)
            continue
        assert without.status_code == 401, (method, path, without.status_code)
        assert with_key.status_code != 401, (method, path, with_key.text)
        assert with_key.status_code < 500, (method, path, with_key.text)
    for path in ("/docs", "/openapi.json"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200


def test_unknown_routes_and_wrong_methods_answer_in_openais_shape(server):
    r = httpx.get(server.url + "/v1/engines", headers=HEADERS, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["message"] == "Invalid URL (GET /v1/engines)"
    r = httpx.delete(server.url + "/v1/chat/completions", headers=HEADERS, timeout=30)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_each_request_leaves_an_access_log_line_with_its_request_id(server):
    r = httpx.get(server.url + "/v1/models", headers={**HEADERS, "X-Request-Id": "walk-7"}, timeout=30)
    assert r.headers["x-request-id"] == "walk-7"
    model = r.json()["data"][0]
    assert model["max_model_len"] > 0
    log = server.log_path.read_text()
    [line] = [line for line in log.splitlines() if "request_id=walk-7" in line]
    assert re.search(r'"GET /v1/models" 200 [\d.]+ ms request_id=walk-7$', line), line
    assert API_KEY not in log
