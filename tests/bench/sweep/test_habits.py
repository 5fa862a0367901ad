"""Client habits: a recipe's [[habit]] entries each run the baseline's points once more with one change
(streaming off, spread prompt lengths, bursty arrivals, no connection reuse, a ramp-up), in the same run,
each habit point naming the baseline point it is compared with. Against the scripted stub."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load import runner
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.habit import Habit
from llmopt.bench.sweep.matrix import matrix
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "client-habits.toml"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def habits_config(endpoint: str, *habits: Habit, **kw) -> BenchConfig:
    settings = {"prompt_lens": [20], "output_lens": [2], "request_rates": [50.0], "num_requests": 6}
    return BenchConfig.from_settings(endpoint=endpoint, warmup=0, habits=list(habits), **{**settings, **kw})


def test_the_recipe_runs_one_baseline_and_one_point_per_habit():
    config = load_recipe(RECIPE)
    config.validate()
    names = [h.name for h in config.habits]
    assert names == ["no-stream", "spread-prompts", "bursty", "no-connection-reuse", "ramp-up"]
    labels = [entry.cell[2].label for entry in matrix(config)]
    assert labels == [
        "rate=1/s",
        "rate=1/s,no-stream,habit=no-stream",
        "rate=1/s,habit=spread-prompts",
        "rate=1/s,burstiness=0.25,habit=bursty",
        "rate=1/s,habit=no-connection-reuse",
        "rate=1/s,ramp-up=10s,habit=ramp-up",
    ]


@pytest.mark.slow
def test_each_habit_point_runs_with_its_one_change(openai_endpoint, tokenizer, tmp_path, monkeypatch):
    reuse = []
    session = runner.client_session
    monkeypatch.setattr(
        runner, "client_session", lambda target: reuse.append(target.connection_reuse) or session(target)
    )
    habits = [
        Habit("no-stream", {"stream": False}),
        Habit("spread", {"prompt_len_spread": 0.5}),
        Habit("bursty", {"burstiness": 0.25}),
        Habit("no-reuse", {"connection_reuse": False}),
    ]
    points = run_sweep(habits_config(openai_endpoint.url, *habits), tmp_path / "r", False, tokenizer)
    base, no_stream, spread, bursty, no_reuse = points
    assert base.habit is None and [p.habit for p in points[1:]] == [h.name for h in habits]
    assert all(p.baseline_key == base.key and p.successful == 6 for p in points[1:])
    assert no_stream.habit_changes == {"stream": [True, False]} and no_stream.stream is False
    assert spread.habit_changes == {"prompt_len_spread": [0.0, 0.5]}
    assert bursty.habit_changes == {"burstiness": [1.0, 0.25]} and "burstiness=0.25" in bursty.load
    assert reuse == [True, True, True, True, False]  # only the habit's point opened a connection per request
    bodies = [body for _, body in openai_endpoint.seen]
    assert [b["stream"] for b in bodies[6:12]] == [False] * 6 and all(b["stream"] for b in bodies[:6])
    lengths = [len(b["messages"][0]["content"].split()) for b in bodies]
    assert len(set(lengths[:6])) == 1 and len(set(lengths[12:18])) > 1  # uniform, then spread


@pytest.mark.slow
def test_arrival_habits_skip_closed_loop_points_and_resume_knows_habit_points(
    openai_endpoint, tokenizer, tmp_path
):
    config = habits_config(openai_endpoint.url, Habit("bursty", {"burstiness": 0.25}), concurrencies=[2])
    keys = [p.key for p in run_sweep(config, tmp_path / "r", False, tokenizer)]
    assert keys == [
        "endpoint|prompt=20|output=2|concurrency=2",
        "endpoint|prompt=20|output=2|rate=50/s",
        "endpoint|prompt=20|output=2|rate=50/s,burstiness=0.25,habit=bursty",
    ]
    sent = len(openai_endpoint.seen)
    assert [p.key for p in run_sweep(config, tmp_path / "r", True, tokenizer)] == keys
    assert len(openai_endpoint.seen) == sent  # every point, habits' included, was done


@pytest.mark.parametrize(
    ("habits", "kw", "message"),
    [
        ([Habit("x", {"burstiness": 0.5})], {"request_rates": [], "concurrencies": [1]}, "shapes arrivals"),
        ([Habit("x", {"stream": False}), Habit("x", {"ramp_up": 2})], {}, "names must differ"),
        ([Habit("x", {"burstiness": 0.5})], {"arrival": "constant"}, "needs --arrival poisson"),
        ([Habit("x", {"prompt_len_spread": 1.5})], {}, "--prompt-len-spread"),
        ([Habit("x", {"stream": "no"})], {}, "stream is true or false"),
        ([Habit("x", {"color": 1})], {}, "changes color"),
        ([Habit("x y", {"stream": False})], {}, "habit name"),
        ([Habit("x", {"stream": False})], {"goodput_search": "ttft=1s"}, "do not mix"),
    ],
)
def test_bad_habits_are_refused(habits, kw, message):
    with pytest.raises(BenchError, match=message):
        habits_config("http://127.0.0.1:1/v1", *habits, **kw).validate()


def test_a_recipes_bad_habit_names_the_file_and_entry(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[target]\nendpoint = "http://127.0.0.1:1/v1"\n[[habit]]\nname = "a"\nstreem = false\n')
    with pytest.raises(BenchError, match=r"r.toml: \[\[habit\]\] #1: habit 'a' changes streem"):
        load_recipe(recipe)
