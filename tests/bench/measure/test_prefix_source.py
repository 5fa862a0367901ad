"""Per-turn TTFT split by where the prompt's prefix came from (the server's prefix cache in RAM, its disk
tier, or computed again), from usage's cached_tokens and llmopt serve's disk_cached_tokens: read from
chat and Responses usage, summarized per turn, and printed by `llmopt bench`."""

from __future__ import annotations

import pytest
from rich.console import Console

from llmopt.bench.load.client import apply_usage
from llmopt.bench.load.responses_wire import chat_usage
from llmopt.bench.measure.session_metrics import prefix_source, summarize_sessions
from llmopt.bench.schema import PointSummary, RequestRecord
from llmopt.cli.render import turns_table


def test_usage_says_how_much_of_the_cache_hit_came_from_disk():
    record = RequestRecord(index=0)
    usage = {"prompt_tokens": 900, "completion_tokens": 4}
    apply_usage(record, {**usage, "prompt_tokens_details": {"cached_tokens": 880, "disk_cached_tokens": 800}})
    assert (record.cached_tokens, record.disk_cached_tokens) == (880, 800)
    apply_usage(record, {**usage, "prompt_tokens_details": {"cached_tokens": 880}})  # another server
    assert (record.cached_tokens, record.disk_cached_tokens) == (880, None)
    responses = {
        "input_tokens": 900,
        "output_tokens": 4,
        "input_tokens_details": {"cached_tokens": 880, "disk_cached_tokens": 64},
    }
    apply_usage(record, chat_usage(responses))
    assert record.disk_cached_tokens == 64


def turn(session: int, k: int, ttft: float, cached: int | None, disk: int | None = None) -> RequestRecord:
    return RequestRecord(
        index=0, start=float(k), ttft=ttft, e2e=ttft + 0.5, prompt_tokens=1000, cached_tokens=cached,
        disk_cached_tokens=disk, success=True, session=session, turn=k,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("cached", "disk", "source"),
    [
        (None, None, None),
        (0, None, "computed"),
        (900, None, "ram"),
        (900, 800, "disk"),
        (300, 200, "computed"),
    ],
)
def test_a_turns_prefix_source_is_where_most_of_its_prompt_came_from(cached, disk, source):
    assert prefix_source(turn(0, 0, 1.0, cached, disk)) == source


def summary() -> dict:
    records = [
        turn(0, 0, 20.0, 0, 0),
        turn(1, 0, 22.0, 0, 0),
        turn(0, 1, 0.5, 990, 900),  # resumed from disk
        turn(1, 1, 0.3, 990, 0),  # still in RAM
        turn(2, 1, 21.0, 100, 0),  # computed again
    ]
    return summarize_sessions(records, wall_s=60.0, planned_turns={0: 2, 1: 2, 2: 2})


def test_each_turns_ttft_is_split_by_its_prefix_source():
    first, second = summary()["turns"]
    assert list(first["ttft_by_prefix"]) == ["computed"] and first["disk_cached_fraction"] == 0
    split = second["ttft_by_prefix"]
    assert {k: (v["turns"], v["ttft_ms"]["median"]) for k, v in split.items()} == {
        "ram": (1, 300.0),
        "disk": (1, 500.0),
        "computed": (1, 21000.0),
    }
    assert second["disk_cached_fraction"] == pytest.approx(900 / 3000)


def test_llmopt_bench_prints_the_split_turn_by_turn():
    point = PointSummary.from_json({"key": "agent@s=3", **summary()})
    table = turns_table([point, PointSummary.from_json({"key": "single", "turns": None})])
    console = Console(width=250, record=True)
    console.print(table)
    text = console.export_text()
    assert "TTFT, prefix from disk" in text and "500 ms (1)" in text and "21,000 ms (1)" in text
    assert turns_table([PointSummary.from_json({"key": "single"})]) is None
