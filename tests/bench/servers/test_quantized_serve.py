"""Quantization in the loop (bench/servers/quantized_serve.py): the cache key, a checkpoint made once and then
found in the cache, a half-written one made again, a failed `llmopt quantize` said plainly, a bad
`quantize` table named with its recipe, and a sweep that serves each checkpoint and records its
quant_report.json figures. `llmopt quantize` is played by a small script (real subprocess, real files)
and the servers by the scripted endpoint: no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmopt.bench.bench_error import BenchError
from llmopt.bench.rundir import RunDir
from llmopt.bench.servers import quantized_serve, server_lifecycle
from llmopt.bench.servers.quantized_serve import (
    QuantizeSpec,
    cache_key,
    ensure_checkpoint,
    parse_quantize,
    prepare_servers,
)
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec, with_overrides
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.checkpoints import load_tokenizer
from llmopt.cli import app
from tests.bench.test_secrets import FakeServer

# Writes --out as `llmopt quantize` does (staged, renamed into place with its report) and notes each call.
FAKE_QUANTIZE = """
import json, pathlib, sys
args = sys.argv[1:]
pathlib.Path(sys.argv[0]).with_suffix(".calls").open("a").write(json.dumps(args) + "\\n")
out = pathlib.Path(args[args.index("--out") + 1])
method = args[args.index("--method") + 1]
if method == "awq":
    print("AWQ: out of memory"); sys.exit(1)
staging = out.with_name(out.name + ".staging")
staging.mkdir(parents=True)
(staging / "model.safetensors").write_bytes(b"w")
report = {"method": method, "bits": 8, "group_size": None, "calibration_samples": 8, "seconds": 1.0,
          "size_before_mb": 538.1, "size_after_mb": 160.0, "perplexity_before": 14.2,
          "perplexity_after": 14.3, "source": "/models/src",
          "kl_divergence_before": {"mean": 0.0, "p99": 0.0},
          "kl_divergence_after": {"mean": 0.004, "p99": 0.03}}
(staging / "quant_report.json").write_text(json.dumps(report))
if out.exists():
    import shutil; shutil.rmtree(out)
staging.rename(out)
"""


@pytest.fixture
def fake_quantize(tmp_path, monkeypatch) -> Path:
    """The stand-in's file of calls: one JSON list of arguments per line."""
    script = tmp_path / "fake_quantize.py"
    script.write_text(FAKE_QUANTIZE)
    monkeypatch.setattr(quantized_serve, "QUANTIZE_PROGRAM", [sys.executable, str(script)])
    return script.with_suffix(".calls")


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_cache_key_follows_method_settings_and_source(tmp_path, monkeypatch):
    gptq = parse_quantize({"method": "gptq", "group_size": 64, "bits": 4})
    assert gptq == parse_quantize({"bits": 4, "method": "gptq", "group_size": 64})  # order is no setting
    assert cache_key(gptq, None) == cache_key(gptq, None) and cache_key(gptq, None).startswith("gptq-")
    others = [
        cache_key(parse_quantize({"method": "gptq", "group_size": 32, "bits": 4}), None),
        cache_key(parse_quantize({"method": "gptq"}), None),
        cache_key(gptq, "other-model"),
        cache_key(QuantizeSpec("int8"), None),
    ]
    assert len({cache_key(gptq, None), *others}) == 5
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)  # the same folder named two ways is the same source
    assert cache_key(gptq, "model") == cache_key(gptq, str(tmp_path / "model"))


def test_a_checkpoint_is_made_once_then_found_in_the_cache(fake_quantize, tmp_path):
    spec = parse_quantize({"method": "int8", "calib_samples": 4})
    folder, cached = ensure_checkpoint(spec, "src-model", tmp_path / "cache", "int8")
    assert not cached and folder == tmp_path / "cache" / cache_key(spec, "src-model")
    [args] = calls(fake_quantize)
    assert args == ["src-model", "--out", str(folder), "--method", "int8", "--calib-samples", "4"]
    assert ensure_checkpoint(spec, "src-model", tmp_path / "cache", "int8") == (folder, True)
    assert len(calls(fake_quantize)) == 1  # the second run did not quantize
    ensure_checkpoint(parse_quantize({"method": "int8"}), "src-model", tmp_path / "cache", "int8")
    assert len(calls(fake_quantize)) == 2  # other settings: another checkpoint


def test_a_half_written_checkpoint_is_made_again(fake_quantize, tmp_path):
    spec = QuantizeSpec("int8")
    folder = tmp_path / "cache" / cache_key(spec, None)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"torn")  # no quant_report.json: never finished
    assert ensure_checkpoint(spec, None, tmp_path / "cache", "int8") == (folder, False)
    assert calls(fake_quantize)[0][-1] == "--overwrite" and (folder / "quant_report.json").is_file()


def test_a_failed_quantize_is_a_bench_error_with_its_log(fake_quantize, tmp_path):
    with pytest.raises(BenchError, match=r"awq: `.*` failed \(exit 1\); log: .*\n.*AWQ: out of memory"):
        ensure_checkpoint(QuantizeSpec("awq"), None, tmp_path / "cache", "awq")
    assert not (tmp_path / "cache" / cache_key(QuantizeSpec("awq"), None)).exists()


@pytest.mark.parametrize(
    "table, message",
    [
        ('{ method = "fp4" }', "method must be one of gptq, awq, int8, not 'fp4'"),
        ('{ method = "gptq", group = 64 }', r"unknown key\(s\) group \(known: method, bits, group_size"),
        ('{ method = "gptq", bits = "4" }', "bits must be a positive integer, not '4'"),
        ('{ method = "gptq", calib_samples = 0 }', "calib_samples must be a positive integer, not 0"),
        ('"gptq"', "must be a table"),
    ],
)
def test_a_bad_quantize_table_names_the_recipe_and_the_key(tmp_path, table, message):
    recipe = tmp_path / "q.toml"
    recipe.write_text(f'[[serve]]\nname = "fp32"\n\n[[serve]]\nname = "q"\nquantize = {table}\n')
    with pytest.raises(BenchError, match=rf"{recipe}: \[\[serve\]\] #2 \(q\): quantize.*{message}"):
        load_recipe(recipe)


def test_configs_are_served_from_their_checkpoints_with_a_baseline(fake_quantize, tmp_path):
    servers = [ServerSpec("fp32", args={"max-num-seqs": 4}), ServerSpec("int8", quantize={"method": "int8"})]
    served, records = prepare_servers(servers, tmp_path / "cache")
    checkpoint = tmp_path / "cache" / cache_key(QuantizeSpec("int8"), None)
    assert served[0] is servers[0] and served[1].model == str(checkpoint)
    assert str(checkpoint) in served[1].command(8123) and servers[1].model is None
    assert records["int8"]["perplexity"] == 14.3 and records["int8"]["size_after_mb"] == 160.0
    assert records["int8"]["method"] == "int8" and records["int8"]["cached"] is False
    # the unquantized config on the same source: the source's figures, as the quantize run measured them
    assert records["fp32"]["method"] == "none" and records["fp32"]["perplexity"] == 14.2
    assert records["fp32"]["size_after_mb"] == 538.1
    # the KL divergence from the source in float32: the checkpoint's, and the source's own for the baseline
    assert records["int8"]["kl_divergence"] == {"mean": 0.004, "p99": 0.03}
    assert records["fp32"]["kl_divergence"] == {"mean": 0.0, "p99": 0.0}
    assert prepare_servers(servers[:1], tmp_path / "cache") == (servers[:1], {})


RECIPE = """
[[serve]]
name = "fp32"

[[serve]]
name = "int8"
quantize = { method = "int8" }

[workload]
prompt_len = 8
output_len = 3

[load]
concurrency = 1
num_requests = 2
warmup = 0
"""


@pytest.mark.slow
def test_a_sweep_quantizes_serves_and_records_each_config(
    fake_quantize, openai_endpoint, tokenizer_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(server_lifecycle, "LocalServer", FakeServer)
    monkeypatch.setattr(FakeServer, "url", openai_endpoint.url.removesuffix("/v1"))
    monkeypatch.setattr(FakeServer, "started", [])
    (tmp_path / "q.toml").write_text(RECIPE)
    config = with_overrides(load_recipe(tmp_path / "q.toml"), {"quantized_cache": str(tmp_path / "cache")})
    tokenizer = load_tokenizer(tokenizer_dir)
    for name in ("first", "second"):
        points = run_sweep(config, tmp_path / name, False, tokenizer)
        assert [p.successful for p in points] == [2, 2]
    assert len(calls(fake_quantize)) == 1  # the second run found the checkpoint in the cache
    checkpoint = str(tmp_path / "cache" / cache_key(QuantizeSpec("int8"), None))
    commands = [server.command for server in FakeServer.started]
    assert checkpoint not in commands[0] and checkpoint in commands[1]  # fp32, int8, then again
    settings = RunDir(tmp_path / "second").read_summary().settings
    assert settings.quantization["int8"].checkpoint == checkpoint
    assert settings.quantization["int8"].cached is True
    assert settings.quantization["fp32"].method == "none"
    assert settings.config["servers"][1]["quantize"] == {"method": "int8"}
    assert "quantize" not in settings.config["servers"][0]  # as runs before quantization wrote it


def test_the_cli_says_a_failed_quantize_without_a_traceback(fake_quantize, tokenizer_dir, tmp_path):
    (tmp_path / "q.toml").write_text(RECIPE.replace('"int8"', '"awq"'))
    args = ["bench", "--recipe", str(tmp_path / "q.toml"), "--tokenizer", str(tokenizer_dir)]
    cache = tmp_path / "elsewhere"
    result = CliRunner().invoke(app, [*args, "--quantized-cache", str(cache), "--results-dir", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "awq: `" in result.output and "AWQ: out of memory" in result.output
    assert [p.suffix for p in cache.iterdir()] == [".log"]  # the flag's folder; no checkpoint in it


def test_the_quantize_settings_are_those_of_llmopt_quantize():
    """The bench repeats `llmopt quantize`'s methods and flags (it may not import quant): kept equal."""
    import inspect

    from llmopt.cli.quantize import quantize
    from llmopt.quant.recipes import METHODS

    assert quantized_serve.METHODS == METHODS
    assert set(quantized_serve.SETTINGS) <= set(inspect.signature(quantize).parameters)


@pytest.mark.slow  # a real `llmopt serve` of the checkpoint
def test_a_cached_int8_checkpoint_is_served_and_benched(int8_dir, tokenizer_dir, tmp_path):
    """The session's INT8 checkpoint (made by `llmopt quantize --method int8 --calib-samples 8
    --eval-windows 1`) put in the cache where that table's key says: served by a real server."""
    table = {"method": "int8", "calib_samples": 8, "eval_windows": 1}
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / cache_key(parse_quantize(table), None)).symlink_to(int8_dir)
    spec = ServerSpec("int8", args={"max-num-seqs": 2}, quantize=table)
    config = BenchConfig.from_settings(
        servers=[spec], prompt_lens=[8], output_lens=[4], concurrencies=[1], num_requests=2, warmup=0
    )
    config.target.quantized_cache = str(tmp_path / "cache")
    [point] = run_sweep(config, tmp_path / "run", False, load_tokenizer(tokenizer_dir))
    assert point.successful == 2 and point.output_tokens == 8
    record = RunDir(tmp_path / "run").read_summary().settings.quantization["int8"]
    assert record.cached is True and record.method == "int8"
    # INT8 W8A8 per channel moves perplexity by about 1 %: within 5 % of the source's, on the same window.
    assert abs(record.perplexity / record.perplexity_before - 1) < 0.05, record
    assert 100 < record.size_after_mb < 0.5 * 538  # under half the source's weights in fp32
    assert 0 < record.kld_mean < 1  # from the source in float32, as quantize measured it
