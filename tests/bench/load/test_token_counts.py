"""Where token counts come from: the server's `usage`, else its /tokenize (asked once per distinct text),
else the local tokenizer; each record and the point's summary say which. Against the scripted endpoint,
whose /tokenize counts 3 tokens a word (the local counter here: 1 a word)."""

from __future__ import annotations

import asyncio
import json

from llmopt.bench.load.client import BenchRequest, Target
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.runner import run_point
from llmopt.bench.load.token_count import TokenCounter, tokenize_url
from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer


def words(text: str) -> int:
    return len(text.split())


def run(endpoint, prompts: list[str], api: str = "chat") -> tuple[list, TokenCounter]:
    target = Target(endpoint.url, "scripted", api=api)
    counter = TokenCounter(words, tokenize_url(endpoint.url), "scripted", target.headers())
    requests = [BenchRequest(prompt=p, max_tokens=3, prompt_tokens=words(p)) for p in prompts]
    point = LoadPoint(concurrency=1, num_requests=len(prompts))
    result = asyncio.run(run_point(target, requests, point, count_tokens=counter))
    assert all(r.success for r in result.records), [r.error for r in result.records]
    return sorted(result.records, key=lambda r: r.index), counter


def test_the_tokenize_route_is_at_the_servers_root():
    assert tokenize_url("http://h:8000/v1") == tokenize_url("http://h:8000/v1/") == "http://h:8000/tokenize"
    assert tokenize_url("http://h:8000") == "http://h:8000/tokenize"


def test_usage_counts_come_first_and_tokenize_is_not_asked(openai_endpoint):
    openai_endpoint.tokenize = True
    records, _ = run(openai_endpoint, ["one two", "three four five"])
    assert [(r.prompt_tokens, r.output_tokens, r.tokens_from) for r in records] == [(10, 3, "usage")] * 2
    assert openai_endpoint.tokenized == []
    assert summarize(records, 1.0)["token_source"] == "usage"


def test_without_usage_the_servers_tokenize_counts_each_distinct_text_once(openai_endpoint):
    openai_endpoint.usage, openai_endpoint.tokenize = False, True
    records, _ = run(openai_endpoint, ["one two", "three four five", "one two", "one two"])
    # 3 tokens a word: the prompt's words (chat messages) and the 3 words of each answer, "word word word"
    assert [(r.prompt_tokens, r.output_tokens) for r in records] == [(6, 9), (9, 9), (6, 9), (6, 9)]
    assert {r.tokens_from for r in records} == {"tokenize"}
    asked = openai_endpoint.tokenized
    assert len(asked) == 3  # two prompts and one answer text, each once
    assert {"model": "scripted", "messages": [{"role": "user", "content": "one two"}]} in asked
    assert {"model": "scripted", "prompt": "word word word ", "add_special_tokens": False} in asked
    assert summarize(records, 1.0)["token_source"] == "tokenize"


def test_a_completion_prompt_is_tokenized_as_a_prompt(openai_endpoint):
    openai_endpoint.usage, openai_endpoint.tokenize = False, True
    [record], _ = run(openai_endpoint, ["one two three four"], api="completions")
    assert (record.prompt_tokens, record.tokens_from) == (12, "tokenize")
    assert {"model": "scripted", "prompt": "one two three four"} in openai_endpoint.tokenized


def test_without_usage_or_tokenize_counts_are_local_and_tokenize_is_asked_no_more(openai_endpoint):
    openai_endpoint.usage = False  # and /tokenize answers 404
    records, counter = run(openai_endpoint, ["one two", "three four five"])
    assert [(r.prompt_tokens, r.output_tokens, r.tokens_from) for r in records] == [
        (2, 3, "local"),
        (3, 3, "local"),
    ]
    assert counter.available is False and counter.counts == {}
    assert summarize(records, 1.0)["token_source"] == "local"


def test_a_run_records_its_token_source(openai_endpoint, tokenizer_dir, tmp_path):
    openai_endpoint.usage, openai_endpoint.tokenize = False, True
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url, prompt_lens=[8], output_lens=[2], num_requests=2, warmup=0
    )
    [point] = run_sweep(config, tmp_path / "run", False, load_tokenizer(tokenizer_dir))
    assert point.token_source == "tokenize" and point.tokens_from == ["tokenize"]
    assert point.output_tokens == 2 * 6  # "word word": 3 tokens a word, by the server's count
    records = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert {r["tokens_from"] for r in records} == {"tokenize"}
