"""`llmopt bench` as a user runs it (a subprocess) against a scripted endpoint: no model, no llmopt server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmopt.bench.rundir import RunDir


def bench(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmopt.cli", "bench", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def write_recipe(path: Path, endpoint: str) -> Path:
    path.write_text(
        f"""
[target]
endpoint = "{endpoint}"
api = "completions"

[workload]
prompt_len = [8]
output_len = [3]

[load]
request_rate = [50]
arrival = "constant"
num_requests = 3
warmup = 0
slo = "ttft=5s"
"""
    )
    return path


@pytest.mark.slow  # several CLI processes, seconds each
def test_flags_override_the_recipe_and_a_tokenizer_folder_is_enough(openai_endpoint, tokenizer_dir, tmp_path):
    recipe = write_recipe(tmp_path / "r.toml", openai_endpoint.url)
    common = ["--recipe", str(recipe), "--tokenizer", str(tokenizer_dir), "--results-dir", str(tmp_path)]

    given = bench(*common, "--api", "chat", "--arrival", "poisson", "--run-name", "given")
    assert given.returncode == 0, given.stderr + given.stdout
    run = RunDir(tmp_path / "given")
    config = run.read_summary().settings.config
    assert (config["api"], config["arrival"]) == ("chat", "poisson")
    assert (config["slo"], config["num_requests"], config["tokenizer"]) == ("ttft=5s", 3, str(tokenizer_dir))
    assert [path for path, _ in openai_endpoint.seen] == ["/v1/chat/completions"] * 3
    [point] = run.load_summaries()
    assert (point.load, point.successful, point.model) == ("rate=50/s", 3, "scripted")
    assert run.report.is_file() and len(run.read_records()) == 3

    openai_endpoint.seen.clear()
    absent = bench(*common, "--run-name", "absent")
    assert absent.returncode == 0, absent.stderr + absent.stdout
    config = RunDir(tmp_path / "absent").read_summary().settings.config
    assert (config["api"], config["arrival"]) == ("completions", "constant")
    assert [path for path, _ in openai_endpoint.seen] == ["/v1/completions"] * 3


@pytest.mark.slow
def test_a_bad_recipe_is_one_error_line(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text("[load]\nconcurency = [1]\n")
    result = bench("--recipe", str(recipe), "--results-dir", str(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "bad.toml: unknown key(s) in [load]: concurency" in " ".join(result.stderr.split())
    assert [p.name for p in tmp_path.iterdir()] == ["bad.toml"]  # no run folder made


@pytest.mark.slow
def test_an_error_quotes_recipe_tables_verbatim(tmp_path):
    result = bench("--results-dir", str(tmp_path))  # neither an endpoint nor a recipe
    assert result.returncode == 1
    assert "a --recipe with [[serve]] configs" in " ".join(result.stderr.split())
