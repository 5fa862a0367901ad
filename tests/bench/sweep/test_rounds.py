"""Rounds: the server configs take turns (A, B, A, B for two configs and two rounds), every round with
fresh prompts that are the same for every config, each point summarized over its rounds; a resumed run
keeps the rounds it finished. A stand-in for LocalServer serves every config from the scripted endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer.main

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.servers import server_lifecycle
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.cli import app
from llmopt.cli.bench import settings_from_options
from tests.bench.conftest import Endpoint


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


class TakingTurns:
    """In place of LocalServer: serves through the scripted endpoint and notes, at each start, its
    config's name (from the command line's --max-num-seqs) and how many requests the endpoint had seen."""

    endpoint: Endpoint | None = None  # set by the fixture
    starts: list[tuple[str, int]] = []
    pid = None  # no process of its own: the scripted endpoint runs in the test's

    def __init__(self, command, ready_timeout_s: float, log_path: Path, env: dict | None = None):
        argv = command(8123)
        self.url = TakingTurns.endpoint.url.removesuffix("/v1")
        seen = len(TakingTurns.endpoint.seen)
        TakingTurns.starts.append((NAMES[argv[argv.index("--max-num-seqs") + 1]], seen))

    def wait_ready(self) -> TakingTurns:
        return self

    def stop(self) -> int:
        return 0


NAMES = {"2": "a", "4": "b"}


@pytest.fixture
def servers(openai_endpoint, monkeypatch) -> Endpoint:
    monkeypatch.setattr(server_lifecycle, "LocalServer", TakingTurns)
    monkeypatch.setattr(TakingTurns, "endpoint", openai_endpoint)
    monkeypatch.setattr(TakingTurns, "starts", [])
    return openai_endpoint


def two_configs(**kw) -> BenchConfig:
    settings = {"prompt_lens": [8], "output_lens": [3], "concurrencies": [1], "num_requests": 2, "warmup": 0}
    specs = [ServerSpec("a", args={"max-num-seqs": 2}), ServerSpec("b", args={"max-num-seqs": 4})]
    return BenchConfig.from_settings(servers=specs, model="scripted", slo="ttft=5s", **{**settings, **kw})


def bodies_per_start(endpoint: Endpoint) -> list[tuple[str, list[str]]]:
    """(config, the JSON bodies it was sent, sorted) for each server start, in order."""
    bounds = [seen for _, seen in TakingTurns.starts] + [len(endpoint.seen)]
    return [
        (name, sorted(json.dumps(body) for _, body in endpoint.seen[bounds[i] : bounds[i + 1]]))
        for i, (name, _) in enumerate(TakingTurns.starts)
    ]


@pytest.mark.slow
def test_configs_take_turns_with_each_rounds_fresh_prompts_the_same_for_all(servers, tokenizer, tmp_path):
    points = run_sweep(two_configs(rounds=2), tmp_path / "r", False, tokenizer)
    sent = bodies_per_start(servers)
    assert [name for name, _ in sent] == ["a", "b", "a", "b"]
    (_, a1), (_, b1), (_, a2), (_, b2) = sent
    assert a1 == b1 and a2 == b2 and len(a1) == 2  # one round's prompts, the same for both configs
    assert not set(a1) & set(a2)  # and fresh in the next round
    assert [(p.key, p.rounds, p.requests) for p in points] == [
        ("a|prompt=8|output=3|concurrency=1", 2, 4),
        ("b|prompt=8|output=3|concurrency=1", 2, 4),
    ]


@pytest.mark.slow
def test_a_point_is_summarized_over_its_rounds(servers, tokenizer, tmp_path):
    points = run_sweep(two_configs(rounds=2), tmp_path / "r", False, tokenizer)
    records = RunDir(tmp_path / "r").read_records()
    for point in points:
        repeats = point.repeats
        assert (repeats.runs, repeats.over) == (2, "rounds")
        # Each round's median E2E from its own records (a record says its run: round r ran run r).
        mine = [r for r in records if r.point == point.key]
        per_round = [float(np.median([r.e2e for r in mine if r.run == n])) * 1000 for n in (0, 1)]
        e2e = repeats.metrics["e2e_ms.median"]
        assert e2e.values == pytest.approx(per_round)
        assert e2e.mean == pytest.approx(np.mean(per_round))
        assert e2e.spread == pytest.approx(max(per_round) - min(per_round))
        assert e2e.ci95[0] <= e2e.mean <= e2e.ci95[1]
        pooled = float(np.median([r.e2e for r in mine])) * 1000
        assert point.e2e_ms["median"] == pytest.approx(pooled) and point.successful == 4


@pytest.mark.slow
def test_a_resumed_run_keeps_the_rounds_it_finished(servers, tokenizer, tmp_path):
    config = two_configs(rounds=2)
    first = run_sweep(config, tmp_path / "r", False, tokenizer)
    before = bodies_per_start(servers)
    # As if killed during b's second round: a's point done, b's second round not, one of its records out.
    run = RunDir(tmp_path / "r")
    run.write_summaries(first[:1], run.read_summary().settings)
    run.rounds.write_text("".join(run.rounds.read_text().splitlines(keepends=True)[:3]))
    TakingTurns.starts.clear()
    sent_before = len(servers.seen)
    resumed = run_sweep(config, tmp_path / "r", True, tokenizer)
    assert [name for name, _ in TakingTurns.starts] == ["b"]  # only what was left: b's second round
    assert sorted(json.dumps(b) for _, b in servers.seen[sent_before:]) == before[3][1]  # as it sent before
    assert [p.key for p in resumed] == [p.key for p in first]
    b = resumed[1]
    assert (b.requests, b.rounds, len(b.repeats.metrics["e2e_ms.median"].values)) == (4, 2, 2)
    assert sum(r.point == b.key for r in run.read_records()) == 4  # the unfinished round's dropped


@pytest.mark.slow
def test_agent_requests_are_byte_identical_for_every_config_of_a_round(servers, tokenizer, tmp_path):
    config = two_configs(
        rounds=2,
        workload="agent",
        agent_tools="text",
        concurrencies=[],
        sessions=[2],
        turns=2,
        system_len=4,
        prompt_lens=[4],
        output_lens=[2],
        num_requests=4,
    )
    run_sweep(config, tmp_path / "r", False, tokenizer)
    (a, a1), (b, b1), (_, a2), (_, b2) = bodies_per_start(servers)
    assert (a, b) == ("a", "b") and a1 == b1 and a2 == b2 and not set(a1) & set(a2)
    bodies = [json.loads(body) for body in a1 + a2]
    assert len(bodies) == 8 and not any("tools" in body for body in bodies)
    assert all(body["max_tokens"] == 2 and body["ignore_eos"] is True for body in bodies)
    assert all(m["role"] in ("system", "user", "assistant") for body in bodies for m in body["messages"])
    assert any("<tool_response>" in m["content"] for body in bodies for m in body["messages"])


def test_rounds_are_read_from_a_recipe_and_checked(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[[serve]]\nname = 'a'\n[workload]\nkind = 'agent'\ntools = 'text'\n[load]\nrounds = 3\n")
    config = load_recipe(path)
    assert (config.load.rounds, config.workload.agent_tools) == (3, "text")
    config.validate()
    for change, said in [
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"rounds": 2, "goodput_search": "ttft=1s", "sessions": [1]}, "rounds and --goodput-search"),
        ({"agent_tools": "json"}, "the agent workload's tools are 'api'"),
    ]:
        with pytest.raises(BenchError, match=said):
            config.replaced(change).validate()


def test_the_engine_recipes_take_turns_and_send_every_engine_the_same_agent_requests():
    recipes = Path(__file__).resolve().parents[3] / "recipes"
    engines, agent = load_recipe(recipes / "engines.toml"), load_recipe(recipes / "engines-agent.toml")
    assert engines.load.rounds == agent.load.rounds == 2
    assert (agent.workload.kind, agent.workload.agent_tools, agent.target.ignore_eos) == (
        "agent",
        "text",
        True,
    )


def test_rounds_is_a_bench_flag_over_the_recipes():
    command = typer.main.get_command(app).commands["bench"]
    given = command.make_context("bench", ["--endpoint", "http://127.0.0.1:1/v1", "--rounds", "3"])
    assert settings_from_options(given.params)["rounds"] == 3
    absent = command.make_context("bench", ["--endpoint", "http://127.0.0.1:1/v1"])
    assert settings_from_options(absent.params)["rounds"] is None  # the recipe's, else BenchConfig's 1
