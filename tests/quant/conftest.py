"""The quantize job with its expensive steps faked: no tokenizer, no llm-compressor, no measurements.
What stays real is everything `llmopt quantize` does to files: the option checks, the staging folder,
the report, the move into place, and the CLI's error line. The fake oneshot writes a small but
plausible compressed-tensors checkpoint (config.json, weights, tokenizer) into the staging folder; the
fake perplexity notes what it was asked to compare."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from llmopt.evaluate.kl_divergence import KLStats
from llmopt.quant.quantize import QuantizeConfig

# A llama-shaped config.json: all the option checks read of the model.
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
SOURCE_WEIGHTS = b"source weights"


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * 256  # enough for two calibration samples of 16 tokens

    def save_pretrained(self, out: Path) -> None:
        (out / "tokenizer.json").write_text("{}")


@dataclass
class FakeJob:
    model: Path  # a source model folder: config.json and "weights"
    model_arg: str | None = None  # what the user names as the model; default: the folder above
    staged: list[Path] = field(default_factory=list)  # the folder each oneshot wrote into
    oneshot_error: BaseException | None = None  # raised once a partial checkpoint is written
    evaluated: list[tuple[str, str | None]] = field(default_factory=list)  # (model, reference) per eval

    def __post_init__(self) -> None:
        if self.model_arg is None:
            self.model_arg = str(self.model)

    def config(self, out: Path, **options) -> QuantizeConfig:
        return QuantizeConfig(
            model=self.model_arg,
            out=out,
            method="int8",
            calib_samples=2,
            seq_len=16,
            eval_windows=1,
            **options,
        )

    def cli(self, out: Path, overwrite: bool = False) -> int:
        """`llmopt quantize` in this process (so the fakes apply); its exit code."""
        from llmopt.cli.quantize import quantize

        try:
            quantize(
                model=self.model_arg,
                out=out,
                method="int8",
                calib_samples=2,
                seq_len=16,
                eval_windows=1,
                overwrite=overwrite,
            )
        except typer.Exit as exc:
            return exc.exit_code
        return 0

    def perplexity(self, model: str, *args, reference: str | None = None, **kwargs) -> SimpleNamespace:
        """Perplexity 10 and, against a reference, a mean KLD of 0.01 for the first model, 0.02 next."""
        self.evaluated.append((model, reference))
        kld = 0.01 * len(self.evaluated)
        stats = None if reference is None else KLStats(kld, kld, kld, kld, kld, 1 - kld, -kld, 127)
        return SimpleNamespace(perplexity=10.0, kl_divergence=stats)

    def run_oneshot(self, model_dir: Path, out: Path, tokenizer, samples, config, group_size) -> float:
        self.staged.append(out)
        (out / "config.json").write_text(
            json.dumps({**CONFIG, "quantization_config": {"quant_method": "compressed-tensors"}})
        )
        (out / "model.safetensors").write_bytes(b"new weights")
        if self.oneshot_error is not None:
            raise self.oneshot_error
        tokenizer.save_pretrained(out)
        return 1.0


def make_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "model.safetensors").write_bytes(SOURCE_WEIGHTS)
    return folder


@pytest.fixture
def fake_job(tmp_path: Path, monkeypatch) -> FakeJob:
    import llmopt.checkpoints
    import llmopt.evaluate.perplexity
    import llmopt.quant.quantize

    job = FakeJob(make_model(tmp_path / "model"))
    monkeypatch.setattr(llmopt.checkpoints, "load_tokenizer", lambda model_dir: FakeTokenizer())
    monkeypatch.setattr(llmopt.quant.quantize, "require_quant_stack", lambda: None)
    monkeypatch.setattr(llmopt.quant.quantize, "run_oneshot", job.run_oneshot)
    monkeypatch.setattr(llmopt.quant.quantize, "decode_speed", lambda model_dir: 100.0)
    monkeypatch.setattr(llmopt.evaluate.perplexity, "perplexity", job.perplexity)
    return job


def leftovers(folder: Path) -> list[str]:
    """Hidden entries: staging folders and moved-aside checkpoints."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def error_lines(stderr: str) -> list[str]:
    """The CLI's error lines (the progress display may print its finished steps above them)."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]
