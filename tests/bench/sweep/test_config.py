"""BenchConfig: what validate refuses, the load points it makes, and how flags override a recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from llmopt.bench.bench_error import BenchError
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec, with_overrides
from llmopt.bench.sweep.recipe import load_recipe


def endpoint_config(**kw) -> BenchConfig:
    return BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", **kw)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (BenchConfig(), "give --endpoint URL"),
        (endpoint_config(api="assistants"), "--api must be"),
        (endpoint_config(arrival="gamma", request_rates=[1.0]), "--arrival must be"),
        (endpoint_config(workload="poems"), "--workload must be one of random, shared-prefix, copy, file"),
        (endpoint_config(workload="file"), "needs --dataset"),
        (endpoint_config(concurrencies=[0]), "concurrency must be >= 1"),
        (endpoint_config(request_rates=[0.0]), "request rates > 0"),
        (endpoint_config(prompt_lens=[0]), "lengths and --num-requests must be >= 1"),
        (endpoint_config(num_requests=0), "lengths and --num-requests must be >= 1"),
        (endpoint_config(max_error_rate=1.5), "--max-error-rate is a fraction"),
        (endpoint_config(slo="latency=1s"), "bad SLO"),
    ],
)
def test_validate_refuses_what_cannot_run(config, message):
    with pytest.raises(BenchError, match=message):
        config.validate()


def test_validate_accepts_local_servers_instead_of_an_endpoint_and_defaults_to_concurrency_one():
    config = BenchConfig.from_settings(servers=[ServerSpec("a")])
    config.validate()
    assert config.load.concurrencies == [1]
    assert [p.label for p in config.load_points()] == ["concurrency=1"]


def test_load_points_carry_the_load_settings():
    config = endpoint_config(
        concurrencies=[1, 4],
        request_rates=[2.5],
        arrival="constant",
        max_concurrency=8,
        num_requests=10,
        warmup=3,
        seed=7,
    )
    config.validate()
    points = config.load_points()
    assert [p.label for p in points] == ["concurrency=1", "concurrency=4", "rate=2.5/s"]
    rate = points[2]
    assert (rate.arrival, rate.max_concurrency, rate.num_requests, rate.warmup, rate.seed) == (
        "constant",
        8,
        10,
        3,
        7,
    )
    assert points[0].max_concurrency is None  # the cap is for open-loop points only


def test_server_spec_flags_follow_llmopt_serve():
    spec = ServerSpec(
        "s",
        model="m.gguf",
        args={
            "max-num-seqs": 4,
            "enable_prefix_caching": False,
            "speculative-config": {"method": "ngram", "num_speculative_tokens": 3},
        },
    )
    command = spec.command(8123)
    assert command[command.index("serve") :] == [
        "serve",
        "--port",
        "8123",
        "m.gguf",
        "--max-num-seqs",
        "4",
        "--no-enable-prefix-caching",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3}',
    ]


def test_a_flag_llmopt_serve_lacks_is_named_before_anything_starts():
    spec = ServerSpec("s", args={"max-num-seqs": 4, "some-switch": True})
    named = r"\[\[serve\]\] s \(engine llmopt\): unknown serve flag --some-switch"
    with pytest.raises(BenchError, match=named):
        spec.check_engine()


RECIPE = """
[target]
endpoint = "http://127.0.0.1:1/v1"
api = "completions"

[workload]
prompt_len = 64

[load]
request_rate = [2, 4]
arrival = "constant"
num_requests = 10
"""


@pytest.fixture
def recipe(tmp_path) -> BenchConfig:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    return load_recipe(path)


def test_flags_override_a_recipe_even_when_they_equal_the_defaults(recipe):
    config = with_overrides(recipe, {"api": "chat", "arrival": "poisson"})
    assert (config.target.api, config.load.arrival) == ("chat", "poisson")
    assert config.load.num_requests == 10 and config.load.request_rates == [
        2,
        4,
    ]  # the rest of the recipe stays


def test_recipe_values_stay_when_the_flags_are_absent(recipe):
    absent = {"api": None, "arrival": None, "num_requests": None, "prompt_lens": None, "model": None}
    config = with_overrides(recipe, absent)
    assert (
        config.target.api,
        config.load.arrival,
        config.load.num_requests,
        config.workload.prompt_lens,
    ) == (
        "completions",
        "constant",
        10,
        [64],
    )
    assert recipe.target.api == "completions" and with_overrides(recipe, {"api": "chat"}) is not recipe


def test_an_endpoint_flag_replaces_the_recipes_local_servers():
    config = BenchConfig.from_settings(servers=[ServerSpec("a"), ServerSpec("b")], num_requests=5)
    assert with_overrides(config, {"endpoint": None}).servers == config.servers
    moved = with_overrides(config, {"endpoint": "http://elsewhere/v1"})
    assert (
        moved.servers == []
        and moved.target.endpoint == "http://elsewhere/v1"
        and moved.load.num_requests == 5
    )


def test_an_override_that_is_no_setting_is_refused():
    with pytest.raises(ValueError, match="not a bench setting: apii"):
        with_overrides(BenchConfig(), {"apii": "chat"})


def bench_options(*args: str) -> dict:
    """The options of `llmopt bench` as Click parses them from `args`, without running the command."""
    from llmopt.cli import app

    command = typer.main.get_command(app).commands["bench"]
    return command.make_context("bench", list(args)).params


def test_the_command_line_overrides_a_recipe_only_with_the_flags_given(tmp_path, monkeypatch):
    from llmopt.cli.bench import settings_from_options

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # --api-key reads it

    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    given = bench_options(
        "--recipe", str(path), "--api", "chat", "--arrival", "poisson", "--prompt-len", "8,16"
    )
    config = with_overrides(load_recipe(path), settings_from_options(given))
    assert (
        config.target.api,
        config.load.arrival,
        config.workload.prompt_lens,
        config.load.num_requests,
    ) == (
        "chat",
        "poisson",
        [8, 16],
        10,
    )

    absent = with_overrides(load_recipe(path), settings_from_options(bench_options("--recipe", str(path))))
    assert (
        absent.target.api,
        absent.load.arrival,
        absent.workload.prompt_lens,
        absent.load.request_rates,
    ) == (
        "completions",
        "constant",
        [64],
        [2, 4],
    )
    assert (
        absent.load.percentiles == (50, 90, 99)
        and absent.target.ignore_eos is True
        and absent.workload.seed == 0
    )

    bare = with_overrides(BenchConfig(), settings_from_options(bench_options()))
    assert bare == BenchConfig()  # with no recipe and no flags, BenchConfig's defaults are the defaults


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", "..", "x\0y", "a:b"])
def test_validate_refuses_a_server_name_that_is_no_safe_file_name(name):
    with pytest.raises(BenchError, match=r"server name .*: server names may use letters, digits"):
        BenchConfig.from_settings(servers=[ServerSpec("ok"), ServerSpec(name)]).validate()


def test_validate_refuses_two_servers_of_one_name():
    with pytest.raises(BenchError, match="server names must differ"):
        BenchConfig.from_settings(
            servers=[ServerSpec("a"), ServerSpec("a", args={"max-num-seqs": 2})]
        ).validate()
    BenchConfig.from_settings(servers=[ServerSpec("a.1"), ServerSpec("A_2-b")]).validate()


def test_a_config_records_its_settings_as_the_recorded_run_has_them():
    """The tables nest the settings; a run still records them as one flat list, in the order and with
    the bytes of a run recorded before (tests/bench/data/recorded_run)."""
    summary = Path(__file__).parents[1] / "data" / "recorded_run" / "summary.json"
    stored = json.loads(summary.read_text())["settings"]["config"]
    config = BenchConfig.from_settings(**{**stored, "percentiles": tuple(stored["percentiles"])})
    assert json.dumps(config.recorded(), indent=2) == json.dumps(stored, indent=2)
    assert "api_key" not in config.replaced({"api_key": "secret"}).recorded()
