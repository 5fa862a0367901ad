"""Structured answers as the bench reports them: a json_schema answer cut by max_tokens is "truncated",
never valid output, however much of it parses; the point's summary, CSV and columns count each outcome."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point
from llmopt.bench.load.structured_answer import structured_outcome
from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.workload.file import file_prompts
from tests.bench.conftest import sse

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
STRICT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
USAGE = b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}'


def chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return json.dumps({"choices": [choice]}).encode()


@pytest.mark.parametrize(
    ("text", "finish", "outcome"),
    [
        ('{"city": "Oslo", "days": 3}', "stop", "valid"),
        ('{"city": "Oslo", "days": 3}', "length", "truncated"),  # parses, but the server cut it
        ('{"city": "Os', "length", "truncated"),
        ('{"city": "Oslo"}', "stop", "invalid"),  # misses a required field
        ('{"city": "Oslo", "days": "3"}', "stop", "invalid"),
        ("Oslo for 3 days", "stop", "invalid"),
        ("", None, "invalid"),
    ],
)
def test_an_answer_is_valid_truncated_or_invalid_against_its_schema(text, finish, outcome):
    assert structured_outcome(STRICT, text, finish) == outcome


def test_json_object_takes_any_json_document():
    assert structured_outcome({"type": "json_object"}, "[1, 2]", "stop") == "valid"
    assert structured_outcome({"type": "json_object"}, "[1, 2", "stop") == "invalid"


def test_a_schema_answer_cut_by_max_tokens_is_counted_truncated_not_valid(openai_endpoint):
    openai_endpoint.replies += [
        sse(chunk('{"city": "Oslo", '), chunk('"days": 3}', "stop"), USAGE),
        sse(chunk('{"city": "Oslo", '), chunk('"da', "length"), USAGE),
    ]
    target = Target(openai_endpoint.url, "scripted")
    work = [BenchRequest(prompt="plan a trip", max_tokens=4, prompt_tokens=3, response_format=STRICT)]
    result = asyncio.run(run_point(target, work, LoadPoint(concurrency=1, num_requests=2)))
    records = sorted(result.records, key=lambda r: r.index)
    assert [(r.finish_reason, r.structured) for r in records] == [("stop", "valid"), ("length", "truncated")]
    sent = [body for _, body in openai_endpoint.seen]
    assert all(body["response_format"] == STRICT and "ignore_eos" not in body for body in sent)
    summary = summarize(result.records, wall_s=1.0)
    counts = [summary[f"structured_{outcome}"] for outcome in ("valid", "truncated", "invalid")]
    assert counts == [1, 1, 0]


def test_free_text_points_have_no_structured_counts(openai_endpoint):
    target = Target(openai_endpoint.url, "scripted")
    work = [BenchRequest(prompt="hi", max_tokens=2, prompt_tokens=1)]
    result = asyncio.run(run_point(target, work, LoadPoint(concurrency=1, num_requests=1)))
    assert result.records[0].structured is None and result.records[0].finish_reason is None
    assert summarize(result.records, wall_s=1.0)["structured_truncated"] is None


def test_a_prompt_file_carries_response_format_and_rejects_a_wrong_one(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "plan a trip", "response_format": STRICT}) + "\n")
    [request] = file_prompts(good, tokenizer, default_output_len=8)
    assert request.response_format == STRICT
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "plan a trip", "response_format": {"type": "xml"}}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: \"response_format\""):
        file_prompts(bad, tokenizer, default_output_len=8)
