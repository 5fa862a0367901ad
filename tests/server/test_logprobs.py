"""logprobs over HTTP with the `openai` client: chat's `logprobs` / `top_logprobs`, completions'
`logprobs` and `echo` (prompt logprobs, the first null; max_tokens 0 scores the prompt alone, as
lm-evaluation-harness asks), vLLM's `prompt_logprobs` and chat `echo`, streamed and not, and each bad
value a 400 naming the parameter."""

from __future__ import annotations

import httpx
import pytest

from llmopt.checkpoints import load_tokenizer
from llmopt.server.logprobs import TokenTexts
from tests.conftest import API_KEY

MODEL = "smollm2-135m"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Write a long story about a dragon."}]
PROMPT = "Once upon a time, in a land far away, there lived a dragon who"


def test_chat_logprobs_stream_and_not(client):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    full = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3)
    [choice] = full.choices
    content = choice.logprobs.content
    assert len(content) == full.usage.completion_tokens == 8 and choice.finish_reason == "length"
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert t.bytes == list(t.token.encode()) and t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert [x.logprob for x in t.top_logprobs] == sorted(
            (x.logprob for x in t.top_logprobs), reverse=True
        )
        assert t.top_logprobs[0].token == t.token  # greedy: the chosen token is the likeliest
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)

    chunks = list(client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3, stream=True))
    streamed = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)

    plain = client.chat.completions.create(**kwargs)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == choice.message.content
    no_top = client.chat.completions.create(**kwargs, logprobs=True)
    assert all(t.top_logprobs == [] for t in no_top.choices[0].logprobs.content)


def test_completion_logprobs_in_the_legacy_shape_stream_and_not(client):
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2}
    full = client.completions.create(**kwargs)
    [choice] = full.choices
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert token in top and top[token] == pytest.approx(logprob)  # the chosen token is always there
        assert 2 <= len(top) <= 3 and max(top.values()) == pytest.approx(logprob)  # greedy

    chunks = list(client.completions.create(**kwargs, stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    [choice] = full.choices
    lp = choice.logprobs
    assert choice.text == PROMPT and full.usage.completion_tokens == 0
    assert len(lp.tokens) == full.usage.prompt_tokens and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # as OpenAI and vLLM
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(t in top and 1 <= len(top) <= 2 for t, top in zip(lp.tokens[1:], lp.top_logprobs[1:]))

    # With generation: the prompt's tokens, then the output's, with one text and one offset list.
    more = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, temperature=0
    )
    mlp = more.choices[0].logprobs
    assert more.choices[0].text.startswith(PROMPT) and len(mlp.tokens) == len(lp.tokens) + 3
    assert mlp.token_logprobs[: len(lp.tokens)] == pytest.approx(lp.token_logprobs, abs=1e-4)
    streamed = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == PROMPT
    assert streamed[0].choices[0].logprobs.tokens == lp.tokens

    echo_only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert echo_only.choices[0].text == PROMPT and echo_only.choices[0].logprobs is None


def test_echo_of_token_ids_decodes_them(server, client):
    ids = httpx.post(server.url + "/tokenize", headers=HEADERS, json={"prompt": PROMPT}).json()["tokens"]
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert out.choices[0].text == PROMPT and len(out.choices[0].logprobs.tokens) == len(ids)


def check_prompt_logprobs(entries: list, prompt_ids: list[int], k: int) -> None:
    """vLLM's shape: one entry per prompt token, the first null, each other {token id: {logprob, rank,
    decoded_token}} holding the prompt's token and the k likeliest (ranks 1..k)."""
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for token_id, entry in zip(prompt_ids[1:], entries[1:]):
        own = entry[str(token_id)]
        assert own["logprob"] <= 0 and own["rank"] >= 1 and isinstance(own["decoded_token"], str)
        # The top k have ranks 1..k; the prompt's token is one of them or comes extra, with its own rank.
        extra = [own["rank"]] if own["rank"] > k else []
        by_rank = sorted(entry.values(), key=lambda v: v["rank"])
        assert [v["rank"] for v in by_rank] == [*range(1, k + 1), *extra]
        logprobs = [v["logprob"] for v in by_rank]
        assert logprobs == sorted(logprobs, reverse=True)


def test_prompt_logprobs_on_completions_and_chat(server, client):
    ids = httpx.post(server.url + "/tokenize", headers=HEADERS, json={"prompt": PROMPT}).json()["tokens"]
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 3}
    )
    [choice] = out.choices
    check_prompt_logprobs(choice.model_extra["prompt_logprobs"], ids, 3)
    assert choice.logprobs is None and not choice.text.startswith(PROMPT)  # no echo asked for
    # The same numbers as echo's legacy logprobs of the prompt (which list 1 likeliest, not 3).
    echoed = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, extra_body={"prompt_logprobs": 3}
    ).choices[0]
    check_prompt_logprobs(echoed.model_extra["prompt_logprobs"], ids, 3)
    own = [e[str(t)]["logprob"] for t, e in zip(ids[1:], choice.model_extra["prompt_logprobs"][1:])]
    assert echoed.logprobs.token_logprobs[1:] == pytest.approx(own, abs=1e-4)
    assert all(1 <= len(top) <= 2 for top in echoed.logprobs.top_logprobs[1:])

    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    tokens = httpx.post(server.url + "/tokenize", headers=HEADERS, json={"messages": MESSAGES}).json()
    check_prompt_logprobs(chat.model_extra["prompt_logprobs"], tokens["tokens"], 0)
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert "prompt_logprobs" not in (plain.model_extra or {})


def test_chat_echo_starts_the_answer_with_the_assistant_s_last_message(client):
    started = "Once upon a time, the dragon"
    messages = [*MESSAGES, {"role": "assistant", "content": started}]
    kwargs = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    echoed = client.chat.completions.create(**kwargs, extra_body={"echo": True}).choices[0].message.content
    assert echoed == started + plain
    chunks = list(client.chat.completions.create(**kwargs, stream=True, extra_body={"echo": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas[0] == started and "".join(deltas) == echoed  # its own chunk, right after the role
    # The last message is the user's: nothing to echo (as vLLM).
    user_last = {**kwargs, "messages": MESSAGES}
    answer = client.chat.completions.create(**user_last).choices[0].message.content
    echo_of_user = client.chat.completions.create(**user_last, extra_body={"echo": True})
    assert echo_of_user.choices[0].message.content == answer


BAD = [
    ("/v1/chat/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {"echo": "maybe"}, "echo"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "lots"}, "logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
]


@pytest.mark.parametrize("path, body, param", BAD)
def test_bad_logprobs_settings_are_a_400_naming_them(server, path, body, param):
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    r = httpx.post(server.url + path, headers=HEADERS, json={"max_tokens": 2, **base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_token_bytes_add_up_to_the_text_even_inside_a_character(model_dir):
    # Byte-level BPE splits "日" or "🙂" across tokens; each token's own bytes still add up to the text.
    tokenizer = load_tokenizer(model_dir)
    texts = TokenTexts(tokenizer)
    text = "naïve 日本語 🙂 ok"
    ids = tokenizer.encode(text)
    assert b"".join(bytes(texts(t)[1]) for t in ids) == text.encode()
    assert "".join(texts(t)[0] for t in tokenizer.encode("plain words here")) == "plain words here"
