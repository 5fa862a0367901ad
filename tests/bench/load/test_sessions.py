"""Multi-turn and agent sessions against the scripted endpoint: the history each turn replays, one turn
at a time per session, sessions as the unit of concurrency, think time, a failed turn ending only its
session, tools sent or (refused) written as text, and the per-turn and per-session summaries."""

from __future__ import annotations

import csv
import json

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.session import SENT, ToolUse, pooled_tools
from llmopt.bench.rundir import RunDir
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.report.html import write_report
from tests.bench.conftest import answer, stall

TOOLS_REFUSED = json.dumps(
    {
        "error": {
            "message": "tools is not supported by this server",
            "type": "invalid_request_error",
            "param": "tools",
        }
    }
)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def sessions_config(endpoint: str, **kw) -> BenchConfig:
    settings = {
        "workload": "multi-turn",
        "sessions": [2],
        "turns": 3,
        "system_len": 12,
        "prompt_lens": [6],
        "output_lens": [3],
        "num_requests": 12,  # 4 sessions of 3 turns
        "warmup": 0,
    }
    return BenchConfig.from_settings(endpoint=endpoint, **{**settings, **kw})


def bodies(endpoint) -> list[dict]:
    return [body for _, body in endpoint.seen]


def test_each_turn_replays_the_whole_history_with_the_answers(openai_endpoint, tokenizer, tmp_path):
    [point] = run_sweep(sessions_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    sent = bodies(openai_endpoint)
    assert len(sent) == 12 and point.successful == 12 and point.load == "sessions=2"
    systems = {body["messages"][0]["content"] for body in sent}
    assert len(systems) == 1 and all(body["messages"][0]["role"] == "system" for body in sent)
    # A request of turn k: system, then k (user, assistant) pairs, then the turn's user text; every
    # assistant message is the answer the server gave (3 words of the scripted endpoint).
    by_length: dict[int, list[list[dict]]] = {}
    for body in sent:
        by_length.setdefault(len(body["messages"]), []).append(body["messages"])
    assert sorted((n, len(v)) for n, v in by_length.items()) == [(2, 4), (4, 4), (6, 4)]
    for messages in by_length[6]:
        roles = [m["role"] for m in messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert messages[2]["content"] == messages[4]["content"] == "word word word "
        assert messages[:4] in by_length[4] and messages[:2] in by_length[2]  # its earlier turns, as sent
    users = [m["content"] for body in sent for m in body["messages"][-1:]]
    assert len(set(users)) == 12  # every turn's text is its own


@pytest.mark.slow
def test_sessions_are_the_unit_of_concurrency_and_turns_go_one_at_a_time(
    openai_endpoint, tokenizer, tmp_path
):
    openai_endpoint.replies.extend(stall(gap_s=0.05, chunks=2, then_stop=False) for _ in range(12))
    run_sweep(sessions_config(openai_endpoint.url, think_time=0.1), tmp_path / "r", False, tokenizer)
    records = RunDir(tmp_path / "r").read_records()
    assert len(records) == 12 and all(r.success for r in records)
    spans = {}
    for r in records:
        spans.setdefault(r.session, []).append((r.turn, r.start, r.start + r.e2e))
    assert sorted(spans) == [0, 1, 2, 3]
    for turns in spans.values():
        turns.sort()
        assert [t for t, _, _ in turns] == [0, 1, 2]
        for (_, _, end), (_, start, _) in zip(turns, turns[1:]):
            assert start >= end + 0.1 - 0.005  # the next turn waits for the answer and the think time
    busy = [(min(s for _, s, _ in t), max(e for _, _, e in t)) for t in spans.values()]
    most = max(sum(1 for s, e in busy if s <= t < e) for t, _ in busy)
    assert most == 2  # two sessions at once, a third only once one has ended


def test_a_failed_turn_ends_its_session_only(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.replies.append(answer(500, json.dumps({"error": {"message": "boom"}})))
    [point] = run_sweep(sessions_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    assert (point.requests, point.failed) == (1 + 3 * 3, 1)
    sessions = point.conversations
    assert (sessions.started, sessions.completed, sessions.failed) == (4, 3, 1)
    records = RunDir(tmp_path / "r").read_records()
    [failed] = [r for r in records if not r.success]
    assert failed.turn == 0 and [r for r in records if r.session == failed.session] == [failed]


@pytest.mark.slow
def test_per_turn_and_per_session_figures_reach_the_summaries(openai_endpoint, tokenizer, tmp_path):
    [point] = run_sweep(sessions_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    assert [t.turn for t in point.turns] == [0, 1, 2]
    assert all(t.requests == t.successful == 4 and t.ttft_ms["median"] > 0 for t in point.turns)
    assert all(t.cached_fraction is None for t in point.turns)  # the scripted server says nothing
    sessions = point.conversations
    assert sessions.completed == 4 and sessions.conversation_ms["median"] > 0
    assert sessions.turns_per_s == pytest.approx(12 / point.duration_s)
    run = RunDir(tmp_path / "r")
    [row] = list(csv.DictReader(run.summary_csv.read_text().splitlines()))
    assert (row["sessions"], row["sessions_completed"], row["load"]) == ("2", "4", "sessions=2")
    turns = list(csv.DictReader(run.turns_csv.read_text().splitlines()))
    assert [(r["key"], r["turn"], r["requests"]) for r in turns] == [
        (point.key, str(k), "4") for k in range(3)
    ]
    html = write_report([run.path], tmp_path / "report.html").read_text()
    assert "<h4>Multi-turn sessions</h4>" in html and "Multi-turn sessions by turn" in html


def test_a_session_rate_starts_sessions_at_that_rate(openai_endpoint, tokenizer, tmp_path):
    config = sessions_config(
        openai_endpoint.url, sessions=[], request_rates=[20.0], arrival="constant", turns=1
    )
    config.load.num_requests = 4
    [point] = run_sweep(config, tmp_path / "r", False, tokenizer)
    assert point.load == "session-rate=20/s" and point.session_rate == 20.0
    starts = sorted(r.start for r in RunDir(tmp_path / "r").read_records())
    assert len(starts) == 4
    assert all(abs(s - i / 20) < 0.04 for i, s in enumerate(starts)), starts


def agent_config(endpoint: str) -> BenchConfig:
    return sessions_config(endpoint, workload="agent", sessions=[1], turns=3, num_requests=3, system_len=8)


def test_agent_turns_carry_a_tool_call_and_its_result(openai_endpoint, tokenizer, tmp_path):
    [point] = run_sweep(agent_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    assert point.tools == "sent" and point.successful == 3
    first, second, third = bodies(openai_endpoint)
    names = [t["function"]["name"] for t in first["tools"]]
    assert all(name in first["messages"][0]["content"] for name in names)  # the system prompt lists them
    assert [m["role"] for m in third["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    call = third["messages"][4]["tool_calls"][0]
    assert third["messages"][5]["tool_call_id"] == call["id"] and call["function"]["name"] in names
    json.loads(call["function"]["arguments"])
    assert third["messages"][2:4] == second["messages"][2:4]  # the earlier call and result, replayed


def test_agent_tools_refused_are_sent_as_text_and_said_so(openai_endpoint, tokenizer, tmp_path):
    openai_endpoint.replies.append(answer(400, TOOLS_REFUSED))
    [point] = run_sweep(agent_config(openai_endpoint.url), tmp_path / "r", False, tokenizer)
    assert point.tools.startswith("refused by the server (HTTP 400: tools is not supported")
    assert (point.requests, point.successful, point.failed) == (3, 3, 0)  # the refusal is no record
    refused, *sent = bodies(openai_endpoint)
    assert "tools" in refused and len(sent) == 3
    assert all("tools" not in body for body in sent)
    last = sent[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "<tool_call>" in last[2]["content"] and last[3]["content"].startswith("<tool_response>")
    assert sent[0]["messages"] == refused["messages"]  # the refused turn, again, as text


def test_a_points_tools_say_a_refusal_if_any_run_or_worker_met_one():
    """A point's runs (point_summary.py) and a run's workers (workers.py) pooled the same way: a refusal
    is what to say, else sent if any sent them; None only where none had tools (multi-turn)."""
    refusal = ToolUse(send=False, refusal="HTTP 400: tools is not supported").summary()
    assert pooled_tools([SENT, refusal, SENT]) == pooled_tools([None, refusal]) == refusal
    assert pooled_tools([SENT, SENT]) == SENT
    assert pooled_tools([None, SENT]) == SENT  # e.g. a resumed round that did not record its tools
    assert pooled_tools([None, None]) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrencies": [2]}, "counts sessions: give --sessions N"),
        ({"api": "completions"}, "needs --api chat"),
        ({"turns": 0}, "--turns must be >= 1"),
        ({"think_time": -1.0}, "--think-time"),
    ],
)
def test_bad_session_settings_are_refused(settings, message):
    with pytest.raises(BenchError, match=message):
        sessions_config("http://127.0.0.1:1/v1", **settings).validate()


def test_sessions_are_refused_for_a_single_request_workload():
    with pytest.raises(BenchError, match="--sessions is for the multi-turn, agent, conversations workloads"):
        BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", sessions=[2]).validate()


def test_a_recipe_and_the_flags_set_the_session_and_traffic_settings(tmp_path):
    from llmopt.bench.sweep.recipe import load_recipe
    from llmopt.cli.bench import settings_from_options
    from tests.bench.sweep.test_config import bench_options

    path = tmp_path / "r.toml"
    path.write_text(
        '[target]\nendpoint = "http://127.0.0.1:1/v1"\n'
        '[workload]\nkind = "agent"\nturn_len = 32\nturns = 3\nsystem_len = 64\nprompt_len_spread = 0.2\n'
        "[load]\nsessions = 2\nthink_time = 0.5\nstream = [true, false]\nreset_prefix_cache = false\n"
        "burstiness = 0.5\nramp_up = 3\n"
    )
    config = load_recipe(path)
    assert (
        config.workload.kind,
        config.workload.prompt_lens,
        config.workload.turns,
        config.workload.system_len,
    ) == ("agent", [32], 3, 64)
    assert (config.load.sessions, config.load.think_time, config.load.streams) == ([2], 0.5, [True, False])
    assert (
        config.load.reset_prefix_cache,
        config.load.burstiness,
        config.load.ramp_up,
        config.workload.prompt_len_spread,
    ) == (
        False,
        0.5,
        3,
        0.2,
    )
    given = settings_from_options(bench_options("--turn-len", "8,16", "--sessions", "1,4", "--no-stream"))
    assert (given["prompt_lens"], given["sessions"], given["streams"]) == ([8, 16], [1, 4], [False])
    with pytest.raises(ValueError, match="--turn-len is the multi-turn name of --prompt-len"):
        settings_from_options(bench_options("--turn-len", "8", "--prompt-len", "8"))
    path.write_text("[workload]\nprompt_len = 8\nturn_len = 8\n")
    with pytest.raises(BenchError, match=r"\[workload\] gives prompt_len and turn_len"):
        load_recipe(path)


def test_session_summary_figures_from_records():
    from llmopt.bench.measure.session_metrics import summarize_sessions
    from llmopt.bench.schema import RequestRecord

    def turn(session: int, k: int, start: float, cached: int | None, success: bool = True) -> RequestRecord:
        return RequestRecord(
            index=0, start=start, ttft=0.1, e2e=0.5, prompt_tokens=100, cached_tokens=cached, success=success,
            session=session, turn=k,
        )  # fmt: skip

    records = [
        turn(0, 0, 0.0, 0),
        turn(0, 1, 1.0, 80),
        turn(1, 0, 0.2, 10),
        turn(1, 1, 2.0, 60, success=False),
    ]
    summary = summarize_sessions(records, wall_s=4.0, planned_turns={0: 2, 1: 2})
    first, second = summary["turns"]
    assert (first["cached_fraction"], second["cached_fraction"]) == (10 / 200, 80 / 100)  # of successes
    assert (second["requests"], second["successful"]) == (2, 1)
    sessions = summary["conversations"]
    assert (sessions["started"], sessions["completed"], sessions["failed"]) == (2, 1, 1)
    assert sessions["conversation_ms"]["median"] == pytest.approx(1500.0)  # 0.0 sent -> 1.0 + 0.5 done
    assert sessions["turns_per_s"] == 3 / 4.0
