"""The OpenAI-compatible API, driven by the official `openai` client against a live server."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.conftest import API_KEY, LiveServer

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_models_lists_the_served_model(client):
    [model] = client.models.list().data
    assert model.id == MODEL


def test_chat_completion_stream_and_not_agree(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert "Paris" in full.choices[0].message.content
    assert full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 10
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_without_usage(client):
    full = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_list_of_prompts_with_n_choices(client):
    out = client.completions.create(
        model=MODEL,
        prompt=["Once upon a time", "The weather today"],
        max_tokens=8,
        n=2,
        temperature=1.0,
        seed=7,
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 32
    singles = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=1.0, seed=7)
        for p in ("Once upon a time", "The weather today")
    ]
    # Each prompt is counted once, not n times.
    assert out.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    by_index = {c.index: c.text for c in out.choices}
    assert by_index[0] == singles[0].choices[0].text  # choice 0 of each prompt uses the request's seed
    assert by_index[2] == singles[1].choices[0].text


def test_token_id_prompts(client):
    out = client.completions.create(model=MODEL, prompt=[[28, 216, 34, 28, 216]], max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 4


def test_stop_strings(client):
    full = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0)
    assert " 7," in full.choices[0].text
    cut = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=" 7,"
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full.choices[0].text[: full.choices[0].text.index(" 7,")]
    streamed = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7,"], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_seed_makes_sampling_reproducible(client):
    def sample(seed: int) -> str:
        r = client.completions.create(model=MODEL, prompt="My favourite animal is", max_tokens=16, seed=seed)
        return r.choices[0].text

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_ignore_eos_and_min_tokens_fix_the_output_length(client):
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=40,
        temperature=0,
        extra_body={"ignore_eos": True, "top_k": 5, "unknown_field": 1},
    )
    assert out.usage.completion_tokens == 40 and out.choices[0].finish_reason == "length"
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=30,
        extra_body={"min_tokens": 30},
    )
    assert out.usage.completion_tokens == 30


def test_prefix_cache_hits_are_reported(client):
    shared = "You are a careful assistant. " * 12
    client.completions.create(model=MODEL, prompt=shared + "First question?", max_tokens=2, temperature=0)
    again = client.completions.create(
        model=MODEL, prompt=shared + "Second question?", max_tokens=2, temperature=0
    )
    assert again.usage.prompt_tokens_details.cached_tokens >= 48


def test_api_key_is_required(server):
    from openai import OpenAI

    wrong = OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").status_code == 200  # health and metrics need no key


BAD_REQUESTS = [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": "", "max_tokens": 4}, 400, None),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi " * 9000, "max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": 5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, 400, "logprobs"),  # the legacy API allows 0-5
    ("/v1/completions", {"prompt": [[1, 2, 99999999]], "max_tokens": 2}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt-99", "prompt": "hi"}, 404, "model"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_REQUESTS)
def test_bad_input_is_a_clear_client_error(server, path, body, status, param):
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    r = httpx.post(
        server.url + path, headers={**HEADERS, "Content-Type": "application/json"}, **kwargs, timeout=60
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    # ... and the server keeps serving.
    ok = httpx.post(server.url + "/v1/completions", headers=HEADERS, json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200


def test_client_disconnect_mid_stream_frees_the_kv_cache(server):
    # 700 tokens take 20+ s here: only an abort frees the blocks within the 5 s allowed.
    body = {"prompt": "Tell me a very long story.", "max_tokens": 700, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", headers=HEADERS, json=body, timeout=60) as r:
        lines = r.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in received)
        assert server.metrics()["llmopt:kv_blocks_used"] > 0
    left = time.monotonic()
    m = server.wait_idle(timeout=5)
    assert m["llmopt:kv_blocks_used"] == 0 and m["llmopt:num_requests_running"] == 0
    assert time.monotonic() - left < 5


def test_200_concurrent_streams_on_a_tiny_pool(server, async_client, client):
    prompts = [f"Write item number {i} of a shopping list:" for i in range(10)] + [
        "Explain in one sentence why the sky is blue.",
        "List three prime numbers:",
    ]
    expected = {
        p: client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
        for p in prompts
    }
    preemptions_before = server.metrics()["llmopt:num_preemptions_total"]

    async def one(prompt: str) -> str:
        stream = await async_client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream])

    async def all_of_them() -> list[str]:
        return await asyncio.gather(*(one(prompts[i % len(prompts)]) for i in range(200)))

    texts = asyncio.run(all_of_them())
    assert [expected[prompts[i % len(prompts)]] for i in range(200)] == texts
    m = server.wait_idle()
    assert m["llmopt:kv_blocks_used"] == 0
    assert m["llmopt:num_preemptions_total"] > preemptions_before, (
        "a 48-block pool must preempt under this load"
    )


def test_metrics_count_requests_and_tokens(server, client):
    before = server.metrics()
    out = client.completions.create(model=MODEL, prompt="Count: one, two,", max_tokens=5, temperature=0)
    after = server.wait_idle()
    assert after["llmopt:request_success_total"] - before["llmopt:request_success_total"] == 1
    assert after["llmopt:generation_tokens_total"] - before["llmopt:generation_tokens_total"] == 5
    assert (
        after["llmopt:prompt_tokens_total"] - before["llmopt:prompt_tokens_total"] == out.usage.prompt_tokens
    )
    assert (
        after["llmopt:time_to_first_token_seconds_count"] > before["llmopt:time_to_first_token_seconds_count"]
    )
    assert (
        after["llmopt:e2e_request_latency_seconds_count"] > before["llmopt:e2e_request_latency_seconds_count"]
    )
    assert (
        after["llmopt:inter_token_latency_seconds_count"] - before["llmopt:inter_token_latency_seconds_count"]
        == 4
    )
    assert after["llmopt:kv_blocks_total"] == 48
    for name in ("llmopt:prefix_cache_queries_total", "llmopt:prefix_cache_hits_total"):
        assert name in after


def test_full_queue_answers_429_and_loses_nothing(model_dir):
    with LiveServer("--max-num-seqs", "1", "--max-queue-len", "2") as s:
        long_body = {"prompt": "Story:", "max_tokens": 300, "ignore_eos": True, "stream": True}
        short_body = {"prompt": "Hello", "max_tokens": 3}
        results: list[int] = []

        def post(body: dict) -> None:
            results.append(httpx.post(s.url + "/v1/completions", json=body, timeout=120).status_code)

        with httpx.stream("POST", s.url + "/v1/completions", json=long_body, timeout=120) as running:
            stream_lines = running.iter_lines()  # kept: a dropped iterator closes the connection
            next(stream_lines)  # the long request is running
            waiters = [threading.Thread(target=post, args=(short_body,)) for _ in range(2)]
            for t in waiters:
                t.start()
            deadline = time.monotonic() + 30
            while s.metrics()["llmopt:num_requests_waiting"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = httpx.post(s.url + "/v1/completions", json=short_body, timeout=30)
            assert refused.status_code == 429
            assert "queue is full" in refused.json()["error"]["message"]
            lines = [line for line in stream_lines if line]
        for t in waiters:
            t.join(120)
        assert results == [200, 200]
        assert lines[-1] == "data: [DONE]"
        assert s.wait_idle()["llmopt:kv_blocks_used"] == 0


def test_sigterm_ends_running_streams_with_an_error_chunk(model_dir):
    with LiveServer() as s:
        body = {"prompt": "Story:", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            s.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        started = time.monotonic()
        # uvicorn re-raises the signal once it has shut down cleanly, so the exit status is -SIGTERM.
        assert s.proc.wait(30) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < 30
        errors = [json.loads(line[6:]) for line in rest if line.startswith("data: {") and '"error"' in line]
        assert errors and "shutting down" in errors[-1]["error"]["message"]
        assert rest[-1] == "data: [DONE]"
