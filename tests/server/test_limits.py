"""What one client sends cannot hurt another: odd sampling settings, unsupported fields, oversized
bodies, clients that leave before their answer. A live server on the real model, raw HTTP and the
`openai` client."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.conftest import API_KEY, LiveServer

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def stream_in_background(server, max_tokens: int) -> tuple[threading.Thread, dict]:
    """A stream of `max_tokens` tokens on another thread; its result lands in the returned dict."""
    result: dict = {}
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}

    def run() -> None:
        with httpx.stream(
            "POST", server.url + "/v1/completions", headers=HEADERS, json=body, timeout=120
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        result["status"], result["lines"] = r.status_code, lines

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_vanishing_temperature_is_greedy_and_harms_no_other_stream(server):
    thread, other = stream_in_background(server, 200)
    time.sleep(0.5)
    tiny = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 1e-39}
    r = httpx.post(server.url + "/v1/completions", headers=HEADERS, json=tiny, timeout=120)
    greedy = httpx.post(
        server.url + "/v1/completions", headers=HEADERS, json={**tiny, "temperature": 0}, timeout=120
    )
    thread.join()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    assert other["status"] == 200 and other["lines"][-1] == "data: [DONE]"
    assert not any('"error"' in line for line in other["lines"])


BAD_FIELDS = [
    ("/v1/completions", {"prompt": "hi", "stop": ""}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": "y" * 257}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": list(range(2000))}, "stop_token_ids"),
    ("/v1/completions", {"prompt": ["hi"] * 100, "n": 3}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "frequency_penalty": 2.5}, "frequency_penalty"),  # beyond [-2, 2]
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),  # beyond [-100, 100]
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "hi", "suffix": "end"}, "suffix"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{}]}, "tools"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
    ),
]


@pytest.mark.parametrize("path, body, param", BAD_FIELDS)
def test_what_the_server_does_not_honour_is_a_400_naming_it(server, path, body, param):
    r = httpx.post(server.url + path, headers=HEADERS, json={"max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_neutral_values_of_unsupported_fields_are_accepted(server):
    body = {"prompt": "hi", "max_tokens": 2, "frequency_penalty": 0, "logit_bias": {}, "tool_choice": "none"}
    assert httpx.post(server.url + "/v1/completions", headers=HEADERS, json=body).status_code == 200


def test_completions_default_to_16_tokens_as_openai(server):
    body = {"prompt": "Once upon a time", "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", headers=HEADERS, json=body, timeout=60)
    assert r.json()["usage"]["completion_tokens"] == 16


def test_a_client_that_leaves_a_plain_request_stops_its_generation(server):
    # 700 tokens take 20+ s here; the server must notice the client leaving and free the blocks at once.
    body = b'{"prompt": "Tell me a story.", "max_tokens": 700, "ignore_eos": true}'
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        while server.metrics()["llmopt:num_requests_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    left = time.monotonic()
    m = server.wait_idle(timeout=5)
    assert m["llmopt:num_requests_running"] == 0 and m["llmopt:kv_blocks_used"] == 0
    assert time.monotonic() - left < 5


@pytest.fixture(scope="module")
def limited_server(model_dir, monkeypatch_module):
    monkeypatch_module.setenv("LLMOPT_API_KEY", "secret-key-from-the-environment")
    with LiveServer("--max-request-bytes", "4096", "--num-kv-blocks", "32") as s:
        yield s


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_api_key_comes_from_the_environment_and_is_never_printed(limited_server):
    url = limited_server.url + "/v1/models"
    assert httpx.get(url).status_code == 401
    ok = httpx.get(url, headers={"Authorization": "Bearer secret-key-from-the-environment"})
    assert ok.status_code == 200
    log = limited_server.log_path.read_text()
    assert "secret-key-from-the-environment" not in log and "ment'" in log  # the last 4 characters only


def test_a_body_over_the_limit_is_413_and_the_server_goes_on(limited_server):
    auth = {"Authorization": "Bearer secret-key-from-the-environment"}
    big = {"prompt": "word " * 2000, "max_tokens": 1}
    r = httpx.post(limited_server.url + "/v1/completions", headers=auth, json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():
        for _ in range(10):
            yield b" " * 1000  # no Content-Length: chunked, counted as it arrives

    r = httpx.post(limited_server.url + "/v1/completions", headers=auth, content=chunks())
    assert r.status_code == 413
    small = httpx.post(
        limited_server.url + "/v1/completions", headers=auth, json={"prompt": "hi", "max_tokens": 1}
    )
    assert small.status_code == 200
