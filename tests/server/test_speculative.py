"""`llmopt serve --speculative-config` over HTTP: the same greedy text as the server without
speculation, and the spec counters in /metrics."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import API_KEY, LiveServer

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
COPY = "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def spec_server(model_dir):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    args = ("--api-key", API_KEY, "--num-kv-blocks", "64", "--dtype", "float32")  # as the main server
    with LiveServer(*args, "--speculative-config", spec) as s:
        yield s


def test_speculation_serves_the_same_greedy_text_and_counts_it(spec_server, server):
    body = {"prompt": COPY, "max_tokens": 24, "temperature": 0}
    plain = httpx.post(server.url + "/v1/completions", headers=HEADERS, json=body, timeout=120).json()
    with httpx.stream(
        "POST",
        spec_server.url + "/v1/completions",
        headers=HEADERS,
        json={**body, "stream": True},
        timeout=120,
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    m = spec_server.wait_idle()
    assert m["llmopt:spec_decode_num_drafts_total"] > 0
    assert (
        0
        < m["llmopt:spec_decode_num_accepted_tokens_total"]
        <= m["llmopt:spec_decode_num_draft_tokens_total"]
    )


def test_max_completion_tokens_bounds_a_chat_answer(server):
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_completion_tokens": 5}
    r = httpx.post(server.url + "/v1/chat/completions", headers=HEADERS, json={**body, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


COLOURS = "Repeat after me: red green blue yellow purple orange black white. Repeat after me: red green blue"


def test_penalties_and_logprobs_under_speculation_match_the_plain_server(spec_server, server):
    """Each verification row is penalized as if the proposals before it had been sampled, so the text
    is what one token at a time gives; and each accepted token's logprobs are those of its own row.
    The n-gram proposer proposes " purple orange black" in one verification, where only a row-by-row
    logit_bias keeps the banned " orange" (row 1) out."""
    [orange] = httpx.post(server.url + "/tokenize", headers=HEADERS, json={"prompt": " orange"}).json()[
        "tokens"
    ]
    body = {"prompt": COLOURS, "max_tokens": 12, "temperature": 0, "logprobs": 2}
    biased = {**body, "logit_bias": {str(orange): -100}, "frequency_penalty": 0.5}

    def complete(s: LiveServer, b: dict) -> dict:
        r = httpx.post(s.url + "/v1/completions", headers=HEADERS, json=b, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    assert " purple orange black" in complete(server, body)["text"]  # what is copied without the bias
    before = spec_server.metrics().get("llmopt:spec_decode_num_accepted_tokens_total", 0)
    plain, spec = complete(server, biased), complete(spec_server, biased)
    assert " orange" not in spec["text"] and spec["text"] == plain["text"]
    assert spec["logprobs"]["tokens"] == plain["logprobs"]["tokens"]
    assert spec["logprobs"]["token_logprobs"] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-4)
    assert spec_server.wait_idle()["llmopt:spec_decode_num_accepted_tokens_total"] > before
