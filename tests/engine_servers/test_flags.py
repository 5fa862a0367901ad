"""Flag translation, one table per engine: every serve option either becomes the engine's flag (or an
environment variable), or is refused by name when set away from its default. Nothing is started."""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from pathlib import Path

import pytest

from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.llama_cpp import llama_cpp_command
from llmopt.engine_servers.llmopt import llmopt_command
from llmopt.engine_servers.options import API_KEY_ENV, ServeOptions
from llmopt.engine_servers.vllm import vllm_command

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}'
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}

# option, value, what vLLM's command line then holds
VLLM_FLAGS = [
    ("host", "0.0.0.0", ["--host", "0.0.0.0"]),
    ("port", 9001, ["--port", "9001"]),
    ("served_model_name", "mine", ["--served-model-name", "mine"]),
    ("max_num_seqs", 8, ["--max-num-seqs", "8"]),
    ("max_num_batched_tokens", 1024, ["--max-num-batched-tokens", "1024"]),
    ("block_size", 32, ["--block-size", "32"]),
    ("num_kv_blocks", 100, ["--num-gpu-blocks-override", "100"]),
    ("max_model_len", 2048, ["--max-model-len", "2048"]),
    ("dtype", "bfloat16", ["--dtype", "bfloat16"]),
    ("enable_prefix_caching", False, ["--no-enable-prefix-caching"]),
    ("speculative_config", NGRAM, ["--speculative-config", json.dumps(VLLM_NGRAM)]),
    ("tensor_parallel_size", 2, ["--tensor-parallel-size", "2"]),
    ("pipeline_parallel_size", 2, ["--pipeline-parallel-size", "2"]),
    ("data_parallel_size", 4, ["--data-parallel-size", "4"]),
]
# option, value, the environment variables vLLM then gets
VLLM_ENV = [
    ("kv_cache_memory_gb", 4.0, {"VLLM_CPU_KVCACHE_SPACE": "4"}),
    ("api_key", "s3cret", {"VLLM_API_KEY": "s3cret"}),
]
VLLM_REFUSED = [
    ("max_queue_len", 10),
    ("max_request_bytes", 1000),
    ("limit_concurrency", 10),
    ("timeout_keep_alive", 1.0),
    ("inflight_prefix_sharing", False),
    ("kv_cache_dtype", "int8"),  # vLLM's --kv-cache-dtype offers fp8 kinds, not int8
    ("lm_head_dtype", "int8"),
    ("kv_disk_gb", 0.0),  # vLLM-CPU has no disk tier of its own (LMCache is GPU-only)
    ("disable_log_requests", True),  # vLLM 0.32 logs no request unless --enable-log-requests
    ("disable_admin_routes", True),
]

LLAMA_FLAGS = [
    ("host", "0.0.0.0", ["--host", "0.0.0.0"]),
    ("port", 9001, ["--port", "9001"]),
    ("served_model_name", "mine", ["--alias", "mine"]),
    ("max_num_seqs", 4, ["--np", "4", "--batch", "512", "--ctx", str(4 * 2048)]),
    ("max_num_batched_tokens", 1024, ["--batch", "1024"]),
    ("max_model_len", 1024, ["--ctx", str(64 * 1024)]),  # context per slot x slots
    ("enable_prefix_caching", False, ["--no-cache-prompt"]),
    ("speculative_config", NGRAM, ["--draft-max", "3", "--spec-ngram-size", "5"]),
]
LLAMA_ENV = [("api_key", "s3cret", {"LLMOPT_API_KEY": "s3cret"})]
LLAMA_REFUSED = [
    ("block_size", 32),
    ("num_kv_blocks", 100),
    ("kv_cache_memory_gb", 2.0),
    ("dtype", "bfloat16"),
    ("max_queue_len", 10),
    ("max_request_bytes", 1000),
    ("limit_concurrency", 10),
    ("timeout_keep_alive", 1.0),
    ("tensor_parallel_size", 2),
    ("pipeline_parallel_size", 2),
    ("data_parallel_size", 2),
    ("inflight_prefix_sharing", False),
    ("kv_cache_dtype", "int8"),
    ("lm_head_dtype", "int8"),
    ("kv_disk_gb", 0.0),  # its prompt cache lives in RAM (--cache-ram); slots are saved only by hand
    ("disable_log_requests", True),
    ("disable_admin_routes", True),
]
# llmopt's own `llmopt serve`, as the bench starts it: every option a flag of its name, set or not.
LLMOPT_FLAGS = [
    ("host", "0.0.0.0", ["--host", "0.0.0.0"]),
    ("port", 9001, ["--port", "9001"]),
    ("served_model_name", "mine", ["--served-model-name", "mine"]),
    ("max_num_seqs", 8, ["--max-num-seqs", "8"]),
    ("max_num_batched_tokens", 1024, ["--max-num-batched-tokens", "1024"]),
    ("block_size", 32, ["--block-size", "32"]),
    ("num_kv_blocks", 100, ["--num-kv-blocks", "100"]),
    ("kv_cache_memory_gb", 2.0, ["--kv-cache-memory-gb", "2.0"]),
    ("enable_prefix_caching", False, ["--no-enable-prefix-caching"]),
    ("max_model_len", 2048, ["--max-model-len", "2048"]),
    ("dtype", "bfloat16", ["--dtype", "bfloat16"]),
    ("max_queue_len", 10, ["--max-queue-len", "10"]),
    ("max_request_bytes", 1000, ["--max-request-bytes", "1000"]),
    ("limit_concurrency", 10, ["--limit-concurrency", "10"]),
    ("timeout_keep_alive", 1.0, ["--timeout-keep-alive", "1.0"]),
    ("speculative_config", NGRAM, ["--speculative-config", NGRAM]),
    ("inflight_prefix_sharing", False, ["--no-inflight-prefix-sharing"]),
    ("kv_cache_dtype", "int8", ["--kv-cache-dtype", "int8"]),
    ("lm_head_dtype", "int8", ["--lm-head-dtype", "int8"]),
    ("kv_disk_gb", 4.0, ["--kv-disk-gb", "4.0"]),
    ("disable_log_requests", True, ["--disable-log-requests"]),
    ("disable_admin_routes", True, ["--disable-admin-routes"]),
]
LLMOPT_ENV = [("api_key", "s3cret", {API_KEY_ENV: "s3cret"})]
LLMOPT_REFUSED = [("tensor_parallel_size", 2), ("pipeline_parallel_size", 2), ("data_parallel_size", 2)]
ENGINES = {
    "llmopt": (llmopt_command, LLMOPT_FLAGS, LLMOPT_ENV, LLMOPT_REFUSED),
    "vllm": (vllm_command, VLLM_FLAGS, VLLM_ENV, VLLM_REFUSED),
    "llama.cpp": (llama_cpp_command, LLAMA_FLAGS, LLAMA_ENV, LLAMA_REFUSED),
}


@pytest.fixture
def hf_folder(tmp_path) -> Path:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    return tmp_path


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    return path


def model_for(engine: str, hf_folder: Path, gguf: Path) -> str:
    return str(hf_folder if engine == "vllm" else gguf)


def contains(argv: list[str], part: list[str]) -> bool:
    return any(argv[i : i + len(part)] == part for i in range(len(argv)))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_option_has_a_row_in_its_engines_table(engine):
    _, flags, env, refused = ENGINES[engine]
    rows = [row[0] for row in flags + env + refused]
    options = {f.name for f in dataclasses.fields(ServeOptions)} - {"model"}
    assert sorted(rows) == sorted(options)


@pytest.mark.parametrize(
    ("engine", "option", "value", "part"),
    [(e, *row) for e, (_, flags, _, _) in ENGINES.items() for row in flags],
)
def test_an_option_becomes_the_engines_flag(engine, option, value, part, hf_folder, gguf):
    translate = ENGINES[engine][0]
    options = ServeOptions(model=model_for(engine, hf_folder, gguf), **{option: value})
    command = translate(options, "/peer/python")
    assert command.argv[0] == "/peer/python" and contains(command.argv, part), command.argv
    assert not contains(translate(ServeOptions(model=options.model), "/p").argv, part) or option == "port"


@pytest.mark.parametrize(
    ("engine", "option", "value", "env"), [(e, *row) for e, (_, _, env, _) in ENGINES.items() for row in env]
)
def test_an_option_becomes_the_engines_environment(engine, option, value, env, hf_folder, gguf):
    command = ENGINES[engine][0](ServeOptions(model_for(engine, hf_folder, gguf), **{option: value}), "/p")
    assert env.items() <= command.env.items()
    assert not any(str(value) == a for a in command.argv[1:]), command.argv  # never on the command line


@pytest.mark.parametrize(
    ("engine", "option", "value"), [(e, *row) for e, (_, _, _, refused) in ENGINES.items() for row in refused]
)
def test_an_option_the_engine_lacks_is_refused_by_name(engine, option, value, hf_folder, gguf):
    translate = ENGINES[engine][0]
    model = model_for(engine, hf_folder, gguf)
    with pytest.raises(EngineError) as error:
        translate(ServeOptions(model, **{option: value}), "/p")
    flag = "--" + option.replace("_", "-")
    assert flag in str(error.value) and engine in str(error.value)
    translate(ServeOptions(model), "/p")  # at its default the option is no error


def test_vllm_gets_llmopts_defaults_the_model_folder_and_a_draft_as_draft_model(hf_folder):
    spec = {"method": "draft", "model": str(hf_folder), "num_speculative_tokens": 2}
    argv = vllm_command(ServeOptions(str(hf_folder), speculative_config=spec), "py").argv
    assert argv[:5] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_folder)]
    assert contains(argv, ["--max-num-seqs", "64"]) and contains(argv, ["--max-num-batched-tokens", "512"])
    assert "--enable-prefix-caching" in argv and "--block-size" not in argv
    given = json.loads(argv[argv.index("--speculative-config") + 1])
    assert given == {"method": "draft_model", "num_speculative_tokens": 2, "model": str(hf_folder)}
    with pytest.raises(EngineError, match="whole GiB"):
        vllm_command(ServeOptions(str(hf_folder), kv_cache_memory_gb=1.5), "py")


def test_llama_cpp_draft_speculation_takes_a_gguf(gguf):
    spec = {"method": "draft", "model": str(gguf), "num_speculative_tokens": 4}
    argv = llama_cpp_command(ServeOptions(str(gguf), speculative_config=spec), "py").argv
    assert contains(argv, ["--draft-max", "4", "--spec-draft", str(gguf)])
    with pytest.raises(EngineError, match="method"):
        llama_cpp_command(ServeOptions(str(gguf), speculative_config='{"method": "eagle"}'), "py")


@pytest.mark.parametrize("translate, model", [(vllm_command, "hf_folder"), (llama_cpp_command, "gguf")])
@pytest.mark.parametrize(
    "config, message",
    [
        ('{"method": "ngram", "num_speculative_tokens": 0}', ">= 1"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}', "unknown speculative"),
        ('{"method": "draft", "num_speculative_tokens": 2}', 'needs "model"'),
    ],
)
def test_a_peer_refuses_a_speculative_config_with_the_engines_own_words(
    request, translate, model, config, message
):
    """One parser: what llmopt's engine refuses, a peer refuses with the same message."""
    path = request.getfixturevalue(model)
    with pytest.raises(EngineError, match=f"--speculative-config: .*{message}"):
        translate(ServeOptions(str(path), speculative_config=config), "py")


def test_the_launcher_accepts_every_flag_the_translation_writes(gguf, monkeypatch):
    """llama_cpp_server.py parses the command llama_cpp_command builds (without xllamacpp: the parse
    comes before its import)."""
    from llmopt.engine_servers import llama_cpp_server

    options = ServeOptions(str(gguf), max_num_seqs=3, max_model_len=256, enable_prefix_caching=False)
    argv = llama_cpp_command(dataclasses.replace(options, speculative_config=NGRAM), sys.executable).argv
    monkeypatch.setattr(sys, "argv", argv[1:])
    parsed = llama_cpp_server.parse_args()
    assert (parsed.np, parsed.ctx, parsed.no_cache_prompt, parsed.spec_ngram_size) == (3, 768, True, 5)
    assert parsed.model == str(gguf) and parsed.alias == "tiny"  # the file's stem, never its path


def test_llmopt_serve_accepts_every_flag_the_translation_writes(gguf):
    """The command llmopt_command builds, every option set, parses as `llmopt serve` (a dry run)."""
    from typer.testing import CliRunner

    from llmopt.cli import app

    values = {option: value for option, value, _ in LLMOPT_FLAGS}
    argv = llmopt_command(ServeOptions(str(gguf), **values), sys.executable).argv
    assert argv[:5] == [sys.executable, "-m", "llmopt.cli", "serve", "--port"] and argv[6] == str(gguf)
    result = CliRunner().invoke(app, [*argv[3:], "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "kv_cache_dtype='int8'" in result.output and "inflight_prefix_sharing=False" in result.output


def test_the_launcher_reads_the_key_where_the_translation_puts_it():
    from llmopt.engine_servers import llama_cpp_server

    assert llama_cpp_server.API_KEY_ENV == API_KEY_ENV  # spelled out there: it imports nothing of llmopt


def test_the_serve_commands_defaults_are_the_options_defaults():
    """An option counts as set when it differs from ServeOptions' default, so the CLI's must match."""
    from llmopt.cli.serve import serve

    given = {name: p.default for name, p in inspect.signature(serve).parameters.items()}
    for field in dataclasses.fields(ServeOptions):
        assert given[field.name] == field.default, field.name
