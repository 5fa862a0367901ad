"""`llmopt quantize` end to end: real llm-compressor runs on the real model, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmopt.checkpoints import bundled_gguf_path
from llmopt.quant.quant_report import REPORT_FILE
from llmopt.quant.quantize import QuantizeConfig, quantize
from tests.conftest import llmopt


def staging_leftovers(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(".")]


def test_int8_cli_writes_a_compressed_tensors_checkpoint_and_a_report(int8_run, model_dir):
    out, result = int8_run
    assert "perplexity" in result.stdout and "decode tok/s" in result.stdout  # the printed table
    assert {"config.json", "model.safetensors", "tokenizer.json", REPORT_FILE} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    report = json.loads((out / REPORT_FILE).read_text())
    for key in (
        "method",
        "bits",
        "group_size",
        "calibration_samples",
        "seconds",
        "size_before_mb",
        "size_after_mb",
        "perplexity_before",
        "perplexity_after",
        "decode_tok_s_before",
        "decode_tok_s_after",
        "kl_divergence_before",
        "kl_divergence_after",
    ):
        assert key in report, key
    assert (report["method"], report["bits"], report["group_size"]) == ("int8", 8, None)
    # The source is the bundled Q4_1 GGUF itself (98 MB); the int8 checkpoint of its weights is under
    # half their fp32 size (538 MB).
    assert report["size_before_mb"] == round(bundled_gguf_path().stat().st_size / 1e6, 1)
    assert 100 < report["size_after_mb"] < 0.5 * 538
    assert abs(report["perplexity_after"] / report["perplexity_before"] - 1) < 0.015
    # From the source in float32: the source as the engine runs it (its Q4_1 blocks) is near it.
    assert (
        0 < report["kl_divergence_before"]["mean"] < 0.01
        and report["kl_divergence_before"]["top1_agreement"] > 0.9
    )
    after = report["kl_divergence_after"]
    assert 0 < after["mean"] < after["p99"] < after["p999"] and after["tokens"] == 511
    assert "mean KLD" in result.stdout
    assert report["decode_tok_s_after"] > 0
    assert not staging_leftovers(out.parent)


def test_gptq_and_awq_checkpoints(gptq_dir, awq_dir):
    for out, method, group_size in ((gptq_dir, "gptq", 64), (awq_dir, "awq", 32)):
        report = json.loads((out / REPORT_FILE).read_text())
        assert (report["method"], report["bits"], report["group_size"]) == (method, 4, group_size)
        weights = report["scheme"]["config_groups"]["group_0"]["weights"]
        assert weights["num_bits"] == 4 and weights["strategy"] == "group"
        assert report["perplexity_after"] < 1.3 * report["perplexity_before"]
        assert (
            0 < report["kl_divergence_after"]["mean"] and report["kl_divergence_after"]["top1_agreement"] < 1
        )
        assert not staging_leftovers(out.parent)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--group-size", "128"), "--group-size 128 must divide every quantized layer's input size"),
        (("--method", "fp8"), "unknown method 'fp8'"),
        (("--method", "awq", "--bits", "8"), "awq takes --bits 4, not 8"),
        (("--calib-samples", "0"), "--calib-samples must be at least 1"),
        (("--model", "/no/such/model"), "model not found"),
    ],
)
@pytest.mark.slow
def test_bad_arguments_fail_in_one_line_before_any_work(tmp_path, args, message):
    args = list(args)
    if args[0] == "--model":
        args = [args[1]]  # the model is the positional argument
    result = llmopt("quantize", *args, "--out", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 1
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and not staging_leftovers(tmp_path)


@pytest.mark.slow  # several CLI processes, seconds each
def test_unwritable_or_existing_out_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = llmopt("quantize", "--method", "int8", "--out", str(blocker / "out"), timeout=120)
    assert result.returncode == 1 and "cannot write to" in result.stderr and "Traceback" not in result.stderr
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="already exists"):
        quantize(QuantizeConfig(model=None, out=existing, method="int8"))
    assert (existing / "keep.txt").read_text() == "user data"


@pytest.mark.slow  # several CLI processes, seconds each
def test_an_interrupted_run_leaves_no_half_checkpoint(tmp_path):
    def step(description: str):
        if description.startswith("INT8"):
            raise KeyboardInterrupt  # Ctrl-C as the quantization starts
        from contextlib import nullcontext

        return nullcontext()

    out = tmp_path / "out"
    config = QuantizeConfig(model=None, out=out, method="int8", calib_samples=2, eval_windows=1)
    with pytest.raises(KeyboardInterrupt):
        quantize(config, step)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
