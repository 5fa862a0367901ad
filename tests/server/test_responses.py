"""The response bodies and the request-to-SamplingParams mapping, without a model: a stand-in group
replays engine outputs."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from llmopt.engine.outputs import RequestOutput
from llmopt.engine.token_logprobs import TokenLogprob
from llmopt.server.admission import sampling_params
from llmopt.server.error_bodies import APIError
from llmopt.server.logprobs import LogprobsWriter
from llmopt.server.protocol import ChatCompletionRequest, CompletionRequest
from llmopt.server.responses import (
    CHAT_COMPLETION,
    TEXT_COMPLETION,
    Reply,
    ResponseUsage,
    TextChunk,
    _event,
    complete,
    stream,
)


def finished(
    prompt: int, output: int, cached: int = 0, reason: str = "length", disk: int = 0
) -> RequestOutput:
    return RequestOutput("r", [1], "!", True, reason, prompt, output, cached, disk)


class ReplayedGroup:
    """Stands in for a RequestGroup: yields the given (choice index, output) pairs in order."""

    def __init__(self, outputs: list[tuple[int, RequestOutput]], n: int, n_per_prompt: int = 1):
        self.replay, self.n_per_prompt = outputs, n_per_prompt
        self.request_ids = [f"r-{i}" for i in range(n)]
        self.engine_thread = SimpleNamespace(stopping=True)

    async def outputs(self):
        for pair in self.replay:
            yield pair


def events(group: ReplayedGroup, reply: Reply, include_usage: bool) -> list[str]:
    async def collect() -> list[str]:
        return [e async for e in stream(group, reply, include_usage)]

    return asyncio.run(collect())


def test_usage_counts_a_shared_prompt_once_and_only_finished_outputs():
    usage = ResponseUsage()
    usage.add(RequestOutput("r", [1], "a", False, prompt_tokens=9, output_tokens=9), 0, 2)
    for index in range(4):  # two prompts (7 and 5 tokens), two choices each
        usage.add(
            finished(7 if index < 2 else 5, 3, cached=4 if index < 2 else 0, disk=4 * (index < 2)), index, 2
        )
    assert usage.to_dict() == {
        "prompt_tokens": 12,
        "completion_tokens": 12,
        "total_tokens": 24,
        "prompt_tokens_details": {"cached_tokens": 4, "disk_cached_tokens": 4},  # from the disk tier
    }


def test_chat_stream_opens_with_the_role_and_ends_with_usage():
    group = ReplayedGroup([(0, RequestOutput("r", [1], "Hi", False)), (0, finished(5, 2))], n=1)
    raw = events(group, Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1), include_usage=True)
    assert raw[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(e[len("data: ") :]) for e in raw[:-1]]
    assert [c["choices"] for c in chunks] == [
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        [{"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "!"}, "logprobs": None, "finish_reason": "length"}],
        [],
    ]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-x" for c in chunks)
    assert [c["usage"] for c in chunks[:-1]] == [None] * 3 and chunks[-1]["usage"]["total_tokens"] == 7


TRICKY_TEXTS = [
    "Hi",
    ' "quoted" \\ back',
    "line\nbreak\ttab",
    "caf\u00e9 \u4e2d\u6587 \U0001f600",
    "\x00\x1f",
    "</script>",
]


@pytest.mark.parametrize("shape", [CHAT_COMPLETION, TEXT_COMPLETION], ids=["chat", "completions"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_a_text_chunk_from_its_template_is_the_whole_body_rendered(shape, include_usage):
    reply = Reply(shape, "m\u00e9", "id-1", 7)
    template = TextChunk.of(reply, 2, include_usage)
    assert template is not None
    for text in TRICKY_TEXTS:
        body = reply.body(shape.chunk_object, [shape.choice(2, shape.delta(text), None)])
        if include_usage:
            body["usage"] = None
        assert template.render(text) == _event(body)


def test_plain_text_streams_the_same_chunks_through_the_template_and_without_one():
    outputs = [RequestOutput("r", [1], t, False) for t in TRICKY_TEXTS] + [finished(5, len(TRICKY_TEXTS) + 1)]
    templated = events(
        ReplayedGroup([(0, o) for o in outputs], n=1),
        Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1),
        include_usage=True,
    )
    # A model named as the placeholder has no template: every chunk is rendered whole.
    whole = events(
        ReplayedGroup([(0, o) for o in outputs], n=1),
        Reply(CHAT_COMPLETION, "\x00", "chatcmpl-x", 1),
        include_usage=True,
    )
    assert TextChunk.of(Reply(CHAT_COMPLETION, "\x00", "chatcmpl-x", 1), 0, True) is None
    assert [e.replace('"\\u0000", "choices"', '"m", "choices"') for e in whole] == templated
    chunks = [json.loads(e[len("data: ") :]) for e in templated[1:-2]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == TRICKY_TEXTS + ["!"]


def test_completion_stream_aborted_by_a_shutdown_ends_with_an_error_event():
    group = ReplayedGroup(
        [(0, RequestOutput("r", [1], "a", False)), (0, finished(5, 1, reason="abort"))], n=1
    )
    raw = events(group, Reply(TEXT_COMPLETION, "m", "cmpl-x", 1), include_usage=False)
    assert "usage" not in json.loads(raw[0][len("data: ") :])
    assert "shutting down" in json.loads(raw[1][len("data: ") :])["error"]["message"]
    assert raw[2:] == ["data: [DONE]\n\n"]


def test_completion_body_keeps_choices_in_index_order():
    group = ReplayedGroup([(1, finished(3, 1)), (0, finished(3, 1))], n=2, n_per_prompt=2)
    body = json.loads(asyncio.run(complete(group, Reply(TEXT_COMPLETION, "m", "cmpl-x", 1))).body)
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "!"), (1, "!")]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 2


def test_sampling_params_offset_the_seed_per_choice_and_fill_the_context():
    req = CompletionRequest(prompt="hi", seed=10, stop="x")
    params = sampling_params(req, None, prompt_len=6, index=2, max_model_len=16)
    assert (params.seed, params.max_tokens, params.stop) == (12, 10, ["x"])
    with pytest.raises(APIError) as full:
        sampling_params(ChatCompletionRequest(messages=[{"role": "user"}]), None, 16, 0, 16)
    assert full.value.status == 400 and full.value.param == "messages"
    with pytest.raises(APIError, match="min_tokens"):
        sampling_params(CompletionRequest(prompt="hi", min_tokens=5), 4, 2, 0, 16)


def fake_token_texts(token_id: int) -> tuple[str, list[int]]:
    text = {1: "a", 2: "bb", 3: "ccc", 4: "é"}[token_id]
    return text, list(text.encode())


def test_echo_and_legacy_logprobs_stream_and_body_agree():
    """Echo's prompt tokens come first (the first without a logprob), offsets run on across chunks,
    and each top dict holds the chosen token too."""
    prompt = [TokenLogprob(1, None, None), TokenLogprob(2, -0.5, [(3, -0.1)])]
    outputs = [
        (
            0,
            RequestOutput(
                "r", [3], "ccc", False, logprobs=[TokenLogprob(3, -0.2, [(3, -0.2)])], prompt_logprobs=prompt
            ),
        ),
        (
            0,
            RequestOutput("r", [4], "é", True, "length", 2, 2, logprobs=[TokenLogprob(4, -1.0, [(1, -0.3)])]),
        ),
    ]

    def writer() -> LogprobsWriter:
        return LogprobsWriter(fake_token_texts, legacy=True, wanted=True, echo=["abb"])

    reply = Reply(TEXT_COMPLETION, "m", "cmpl-x", 1, logprobs=writer())
    body = json.loads(asyncio.run(complete(ReplayedGroup(outputs, n=1), reply)).body)
    [choice] = body["choices"]
    assert choice["text"] == "abbcccé"
    assert choice["logprobs"] == {
        "tokens": ["a", "bb", "ccc", "é"],
        "token_logprobs": [None, -0.5, -0.2, -1.0],
        "top_logprobs": [None, {"ccc": -0.1, "bb": -0.5}, {"ccc": -0.2}, {"a": -0.3, "é": -1.0}],
        "text_offset": [0, 1, 3, 6],
    }
    reply = Reply(TEXT_COMPLETION, "m", "cmpl-x", 1, logprobs=writer())
    chunks = [json.loads(e[len("data: ") :]) for e in events(ReplayedGroup(outputs, n=1), reply, False)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    merged = {
        key: [x for c in chunks for x in c["choices"][0]["logprobs"][key]] for key in choice["logprobs"]
    }
    assert merged == choice["logprobs"]


def test_chat_logprobs_in_openais_shape():
    out = RequestOutput(
        "r", [4], "é", True, "stop", 3, 1, logprobs=[TokenLogprob(4, -0.7, [(4, -0.7), (1, -2.0)])]
    )
    writer = LogprobsWriter(fake_token_texts, legacy=False, wanted=True)
    reply = Reply(CHAT_COMPLETION, "m", "chatcmpl-x", 1, logprobs=writer)
    body = json.loads(asyncio.run(complete(ReplayedGroup([(0, out)], n=1), reply)).body)
    assert body["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "é",
                "logprob": -0.7,
                "bytes": [195, 169],
                "top_logprobs": [
                    {"token": "é", "logprob": -0.7, "bytes": [195, 169]},
                    {"token": "a", "logprob": -2.0, "bytes": [97]},
                ],
            }
        ]
    }
