"""The endpoints around generation that vLLM's server has and tools call: /tokenize, /detokenize,
/reset_prefix_cache, metrics under vLLM's names, and the stream's first chunk at the first token."""

from __future__ import annotations

import json
import time

import httpx

from tests.conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, headers=HEADERS, json=body, timeout=120)


def test_tokenize_and_detokenize_round_trip(server, llm):
    text = "The capital of France is Paris."
    r = post(server, "/tokenize", {"prompt": text}).json()
    assert r["tokens"] == llm.tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == llm.engine.max_model_len
    assert post(server, "/detokenize", {"tokens": r["tokens"]}).json()["prompt"] == text
    messages = [{"role": "user", "content": "Hi!"}]
    chat = post(server, "/tokenize", {"messages": messages}).json()
    assert chat["tokens"] == llm.engine.chat_token_ids(messages)


def test_tokenize_refuses_what_it_cannot_do(server):
    assert post(server, "/tokenize", {}).status_code == 400
    assert (
        post(server, "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}).status_code
        == 400
    )
    assert post(server, "/detokenize", {"tokens": [10**9]}).json()["error"]["param"] == "tokens"
    assert post(server, "/tokenize", {"model": "gpt-99", "prompt": "a"}).status_code == 404


def test_reset_prefix_cache_forgets_what_earlier_requests_left(server):
    body = {"prompt": "In a quiet village by the sea, " * 12, "max_tokens": 1}
    post(server, "/v1/completions", body)
    again = post(server, "/v1/completions", body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert post(server, "/reset_prefix_cache", {}).status_code == 200
    after = post(server, "/v1/completions", body).json()
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_metrics_are_also_under_vllms_names(server):
    post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    m = server.wait_idle()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:spec_decode_num_drafts_total",
    ):
        assert name in m, name
    assert m["vllm:generation_tokens_total"] == m["llmopt:generation_tokens_total"]
    assert m["vllm:kv_cache_usage_perc"] == 0


def test_the_first_chunk_of_a_stream_leaves_with_the_first_token(server):
    # A long prompt: its prefill takes a good part of a second, and the role chunk must not leave before.
    messages = [{"role": "user", "content": "Summarize this: " + "the tide comes in and goes out. " * 60}]
    body = {"messages": messages, "max_tokens": 3, "stream": True}
    times = []
    sent = time.perf_counter()
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", headers=HEADERS, json=body, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append((time.perf_counter() - sent, json.loads(line[6:])))
    (first_at, first), (second_at, second) = times[0], times[1]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert second["choices"][0]["delta"].get("content")
    assert second_at - first_at < 0.05, (first_at, second_at)  # the role went with the first token
