"""The API key never reaches a file of a run folder: not the summaries, the records, the report or a
local server's log, neither the bench's key nor one that a [[serve]] config gives its server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from llmopt.bench.rundir import RunDir
from llmopt.bench.servers import server_lifecycle
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.checkpoints import load_tokenizer
from llmopt.cli.bench_run import run_bench
from llmopt.engine_servers.llmopt import llmopt_environment
from llmopt.engine_servers.options import API_KEY_ENV
from tests.bench.conftest import answer

SECRET = "sk-test-7Hq2xZ9pLm4vB8nR"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def files_holding(folder: Path, text: str) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.is_file() and text in p.read_text(errors="replace")]


def small(**kw) -> BenchConfig:
    return BenchConfig.from_settings(
        prompt_lens=[8], output_lens=[2], num_requests=3, warmup=0, slo="ttft=5s", **kw
    )


@pytest.mark.slow
def test_the_benchs_key_is_sent_but_written_nowhere(openai_endpoint, tokenizer, tmp_path):
    # A server that echoes the key it refuses, as some do in their error messages.
    openai_endpoint.replies.append(answer(401, json.dumps({"error": {"message": f"bad key {SECRET}"}})))
    out = io.StringIO()
    config = small(endpoint=openai_endpoint.url, api_key=SECRET)
    assert run_bench(config, tmp_path / "r", False, tokenizer, Console(file=out, width=200)) == 1
    assert openai_endpoint.auth == [f"Bearer {SECRET}"] * 3
    run = RunDir(tmp_path / "r")
    [point] = run.load_summaries()
    assert point.failed == 1 and point.errors == ["HTTP 401: bad key ***"]
    assert {"summary.json", "summary.csv", "requests.jsonl", "report.html"} <= {
        p.name for p in run.path.iterdir()
    }
    assert files_holding(run.path, SECRET) == [] and SECRET not in out.getvalue()


class FakeServer:
    """In place of LocalServer: keeps the command and environment it was given, logs its command line
    as a server might (in a usage error, say), and serves through the scripted endpoint."""

    started: list[FakeServer] = []
    url = ""  # the scripted endpoint's, set by the test
    pid = None  # no process of its own: the scripted endpoint runs in the test's

    def __init__(self, command, ready_timeout_s: float, log_path: Path, env: dict | None = None):
        self.command, self.env, self.url = command(8123), env, FakeServer.url
        log_path.write_text(" ".join(self.command) + "\n")
        FakeServer.started.append(self)

    def wait_ready(self) -> FakeServer:
        return self

    def stop(self) -> int:
        return 0


@pytest.mark.slow
def test_a_local_servers_key_goes_in_its_environment_not_its_command_line(
    openai_endpoint, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(server_lifecycle, "LocalServer", FakeServer)
    monkeypatch.setattr(FakeServer, "url", openai_endpoint.url.removesuffix("/v1"))
    monkeypatch.setattr(FakeServer, "started", [])
    spec = ServerSpec("guarded", args={"api-key": SECRET, "max-num-seqs": 2})
    config = small(servers=[spec, ServerSpec("open", args={"max_num_seqs": 4})])
    assert run_bench(config, tmp_path / "r", False, tokenizer, Console(file=io.StringIO())) == 0

    guarded, open_ = FakeServer.started
    assert SECRET not in " ".join(guarded.command) and "--max-num-seqs" in guarded.command
    assert guarded.env[API_KEY_ENV] == SECRET and API_KEY_ENV not in open_.env
    assert openai_endpoint.auth == [f"Bearer {SECRET}"] * 3 + [None] * 3  # the client sends that key
    run = RunDir(tmp_path / "r")
    args = [p.server_args for p in run.load_summaries()]
    assert args == [{"api-key": "***", "max-num-seqs": 2}, {"max_num_seqs": 4}]
    servers = run.read_summary().settings.config["servers"]
    assert servers[0]["args"] == {"api-key": "***", "max-num-seqs": 2}
    assert (run.path / "server-guarded.log").is_file()
    assert files_holding(run.path, SECRET) == []


def test_a_local_server_never_inherits_a_key_from_our_environment(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-the-shell")
    monkeypatch.setenv("HOME_FOR_TEST", "kept")
    assert API_KEY_ENV not in llmopt_environment(None) and llmopt_environment(None)["HOME_FOR_TEST"] == "kept"
    assert llmopt_environment("k")[API_KEY_ENV] == "k"


def test_a_key_in_server_args_stays_off_the_flags():
    spec = ServerSpec("s", args={"api_key": SECRET, "max-num-seqs": 4})
    command = spec.command(8123)
    assert command[command.index("serve") :] == ["serve", "--port", "8123", "--max-num-seqs", "4"]
    assert spec.env()[API_KEY_ENV] == SECRET
    assert spec.recorded_args() == {"api_key": "***", "max-num-seqs": 4}
    assert spec.args["api_key"] == SECRET  # the spec itself is not changed
    assert SECRET not in json.dumps(BenchConfig.from_settings(api_key=SECRET, servers=[spec]).recorded())
