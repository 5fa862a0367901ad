"""frequency_penalty, presence_penalty, repetition_penalty, logit_bias and min_p over HTTP with the
`openai` client: each changes a greedy answer as its definition says (the logits-level checks are in
tests/engine/test_penalties.py), streamed and not alike, and each bad value is a 400 naming it."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import API_KEY

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
LOOP = "Repeat after me: the cat, the cat, the cat, the cat, the cat,"
VLLM_FIELDS = ("repetition_penalty", "min_p")


def token_id(server, text: str) -> int:
    [token] = httpx.post(server.url + "/tokenize", headers=HEADERS, json={"prompt": text}).json()["tokens"]
    return token


def greedy(client, **kwargs) -> str:
    body = {"model": MODEL, "prompt": LOOP, "max_tokens": 16, "temperature": 0, **kwargs}
    # vLLM's own fields go through the client's extra_body, as a vLLM user sends them.
    extra = {name: body.pop(name) for name in VLLM_FIELDS if name in body}
    return client.completions.create(**body, extra_body=extra).choices[0].text


def test_frequency_penalty_breaks_a_greedy_loop(client):
    plain = greedy(client)
    assert plain.count("cat") >= 3  # without a penalty the model goes round and round
    penalized = greedy(client, frequency_penalty=2.0)
    assert penalized.count("cat") < plain.count("cat")
    chunks = client.completions.create(
        model=MODEL, prompt=LOOP, max_tokens=16, temperature=0, frequency_penalty=2.0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == penalized


@pytest.mark.parametrize("settings", [{"presence_penalty": 2.0}, {"repetition_penalty": 2.0}])
def test_presence_and_repetition_penalties_change_a_greedy_loop(client, settings):
    assert greedy(client, **settings).count("cat") < greedy(client).count("cat")


def test_logit_bias_forces_and_forbids_tokens(server, client):
    banana = token_id(server, " banana")
    forced = greedy(client, max_tokens=4, logit_bias={str(banana): 100})
    assert forced == " banana" * 4
    plain = greedy(client, max_tokens=1)
    first = token_id(server, plain)
    assert greedy(client, max_tokens=1, logit_bias={str(first): -100}) != plain
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=3,
        temperature=0,
        logit_bias={str(banana): 100},
    )
    assert chat.choices[0].message.content == " banana" * 3


def test_min_p_1_keeps_only_the_likeliest_token(client):
    # Sampling at temperature 1 from what min_p = 1 leaves is greedy decoding (and without it, not).
    story = {"prompt": "My favourite thing to do on a rainy day is", "max_tokens": 24}
    plain = greedy(client, **story)
    assert greedy(client, **story, temperature=1.0, min_p=1.0, seed=5) == plain
    assert greedy(client, **story, temperature=1.0, seed=5) != plain


def test_values_that_ask_for_nothing_are_accepted(client):
    neutral = {
        "frequency_penalty": 0,
        "presence_penalty": None,
        "repetition_penalty": 1.0,
        "min_p": 0,
        "logit_bias": {},
    }
    assert greedy(client, **neutral) == greedy(client)


BAD = [
    {"frequency_penalty": 2.5},
    {"frequency_penalty": -2.01},
    {"presence_penalty": 3},
    {"repetition_penalty": 0},
    {"repetition_penalty": 2.5},
    {"min_p": 1.5},
    {"min_p": -0.1},
    {"logit_bias": {"5": 101}},
    {"logit_bias": {"5": -100.5}},
    {"logit_bias": {"abc": 1}},
    {"logit_bias": {"-1": 1}},
    {"logit_bias": {" 5": 1}},
    {"logit_bias": {"99999999": 1}},
    {"logit_bias": {"49152": 1}},  # one past the vocabulary
    {"logit_bias": [1, 2]},
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("body", BAD, ids=lambda b: f"{next(iter(b))}={list(b.values())[0]}")
def test_bad_sampling_controls_are_a_400_naming_them(server, path, body):
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    r = httpx.post(server.url + path, headers=HEADERS, json={"max_tokens": 2, **base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    [param] = body
    assert r.json()["error"]["param"] == param, r.json()
