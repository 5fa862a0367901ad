"""The conversations workload: ShareGPT and OpenAI-style files read into sessions (every turn, each
answer's length as its output length), sent turn by turn, and bad entries named by their line."""

from __future__ import annotations

import json

import pytest

from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.bench.workload import count_tokens, file_conversations
from llmopt.checkpoints import load_tokenizer

SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "You answer in one line."},
            {"from": "human", "value": "the first question"},
            {"from": "gpt", "value": "a short answer"},
            {"from": "human", "value": "and a second question"},
            {"from": "gpt", "value": "one two three four five six"},
            {"from": "human", "value": "a last question"},
        ]
    },
    {"conversations": [{"from": "human", "value": "only one"}, {"from": "gpt", "value": "yes"}]},
]
MESSAGES = [
    {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]},
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "the answer to one"},
            {"role": "user", "content": "two"},
        ]
    },
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def test_sharegpt_conversations_keep_every_turn(tokenizer, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    first, second = file_conversations(path, tokenizer, default_output_len=7)
    assert first.system == "You answer in one line."
    assert [t.text for t in first.turns] == ["the first question", "and a second question", "a last question"]
    # Each turn asks for as many tokens as the file's answer to it had; the unanswered last, the default.
    assert [t.max_tokens for t in first.turns] == [count_tokens(tokenizer, "a short answer"), 6, 7]
    assert [t.tokens for t in first.turns] == [count_tokens(tokenizer, t.text) for t in first.turns]
    assert second.system is None and [t.text for t in second.turns] == ["only one"]


def test_openai_style_jsonl_conversations(tokenizer, tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in MESSAGES) + "\n\n")
    first, second = file_conversations(path, tokenizer, default_output_len=9)
    assert [(t.text, t.max_tokens) for t in first.turns] == [("hello there", 1)]
    assert second.system == "be brief" and [(t.text, t.max_tokens) for t in second.turns] == [
        ("one", count_tokens(tokenizer, "the answer to one")),
        ("two", 9),
    ]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": "no"}\n', ":2: an entry needs"),
        ('{"messages": [{"role": "user", "content": "ok"}]}\nnot json\n', ":2: not JSON"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}\n', ":1: message 1: needs a role"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}\n', ":1: no user turn"),
        (
            '[{"conversations": [{"from": "human", "value": "a"}]}, {"conversations": [{"from": "human"}]}]',
            ": conversation #2: message 1",
        ),
    ],
)
def test_a_bad_entry_is_an_error_naming_its_line(tokenizer, tmp_path, text, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path}{where}"):
        file_conversations(path, tokenizer, 4)


def test_every_turn_of_a_file_conversation_is_sent(openai_endpoint, tokenizer, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url, workload="conversations", dataset=str(path), sessions=[2], warmup=0
    )
    config.load.num_requests = 4
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert point.successful == 4 and point.conversations.completed == 2
    sent = sorted((body["messages"] for _, body in openai_endpoint.seen), key=len)
    assert [m[-1]["content"] for m in sent] == [
        "only one",
        "the first question",
        "and a second question",
        "a last question",
    ]
    assert [m["role"] for m in sent[-1]] == ["system", "user", "assistant", "user", "assistant", "user"]
    # The history holds the server's answer, as long as the file's answer was.
    assert sent[-1][2]["content"] == "word " * count_tokens(tokenizer, "a short answer")
