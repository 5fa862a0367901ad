"""`llmopt quantize`: GPTQ, AWQ or INT8 with llm-compressor, written as a compressed-tensors checkpoint
(what vLLM loads) with a quality and speed report.

The job: check the options against the model, stage the checkpoint in a folder beside `--out`, run
llm-compressor's oneshot into it, measure before and after, and rename it into place only when done.
What each method means lives in recipes.py; what is measured, in report.py; how `--out` is checked,
staged and replaced, in out_folder.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from safetensors import SafetensorError

from llmopt.quant.out_folder import (
    CheckpointWriteError,
    make_staging_dir,
    model_sources,
    publish,
    refuse_existing,
    refuse_source_overlap,
    remove_stale_staging,
)
from llmopt.quant.quant_report import QuantReport, checkpoint_size_mb, decode_speed, write_report
from llmopt.quant.recipes import BITS, CALIBRATION_SAMPLES, METHODS, PIPELINES, choose_group_size, recipe

INSTALL_HINT = "pip install 'llmopt[quant]'"


class QuantStackMissing(Exception):
    """llm-compressor (or a library it needs) cannot be imported; the message says what to install."""


@dataclass
class QuantizeConfig:
    model: str | None  # HF folder, .gguf file or the default alias
    out: Path
    method: str = "gptq"
    bits: int | None = None  # default: 4 for gptq/awq, 8 for int8
    group_size: int | None = None  # default: per channel at 8 bits, else from GROUP_SIZES
    calib: Path | None = None  # plain text or JSONL; default: the built-in corpus
    calib_samples: int | None = None  # default: CALIBRATION_SAMPLES[method]
    seq_len: int = 256
    eval_seq_len: int = 512
    eval_windows: int = 8
    kl_divergence: bool = True  # also compare before and after with the source in float32
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}: choose {', '.join(METHODS)}")
        if self.bits is None:
            self.bits = BITS[self.method][0]
        if self.bits not in BITS[self.method]:
            allowed = " or ".join(map(str, BITS[self.method]))
            raise ValueError(f"{self.method} takes --bits {allowed}, not {self.bits}")
        if self.calib_samples is None:
            self.calib_samples = CALIBRATION_SAMPLES[self.method]
        if self.calib_samples < 1 or self.seq_len < 16:
            raise ValueError("--calib-samples must be at least 1 and --seq-len at least 16")


def require_quant_stack() -> None:
    """Import llm-compressor and datasets now, so that a missing `quant` extra is one clear message
    before any work, not a traceback after the first measurements."""
    # llm-compressor logs, on import, that there is no GPU: keep its console to errors (a user's own
    # LLM_COMPRESSOR_LOG_LEVEL wins); our progress shows the steps.
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    try:
        import datasets  # noqa: F401
        import llmcompressor  # noqa: F401
    except ImportError as exc:
        raise QuantStackMissing(
            f"llmopt quantize needs llm-compressor, not installed here ({exc}): {INSTALL_HINT}"
        ) from None


def quantize(
    config: QuantizeConfig, step: Callable[[str], AbstractContextManager] = lambda _: nullcontext()
) -> QuantReport:
    """Quantize `config.model` into `config.out`; `step(description)` wraps each long step (progress)."""
    from llmopt.checkpoints import load_tokenizer, resolve_model
    from llmopt.evaluate.eval_text import calibration_samples, split_tokens

    # Before any work: an --out over the source would be deleted by --overwrite, or written into it.
    refuse_source_overlap(config.out, model_sources(config.model))
    model_dir = resolve_model(config.model)
    refuse_source_overlap(config.out, [model_dir])  # the named model's own file
    # Before the existing-checkpoint check: a killed run's old checkpoint may be moved back to --out.
    remove_stale_staging(config.out)
    refuse_existing(config.out, config.overwrite)
    group_size = choose_group_size(config.method, config.bits, config.group_size, model_dir)
    require_quant_stack()
    tokenizer = load_tokenizer(model_dir)
    samples = calibration_samples(
        split_tokens(tokenizer, config.calib).calibration, config.calib_samples, config.seq_len
    )
    staging = make_staging_dir(config.out)
    try:
        report = quantize_into(staging, model_dir, tokenizer, samples, group_size, config, step)
        write_report(staging, report)
        publish(staging, config.out)
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own error
        raise CheckpointWriteError(
            f"quantizing into {config.out} stopped: {reason(exc)} ({config.out} is as it was)"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def reason(exc: Exception) -> str:
    """One line: the OS's words and the file (ENOSPC, EACCES), else the message with newlines folded."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(exc).split())


def quantize_into(
    staging: Path,
    model_dir: Path,
    tokenizer,
    samples: list[list[int]],
    group_size: int | None,
    config: QuantizeConfig,
    step: Callable[[str], AbstractContextManager],
) -> QuantReport:
    """Measure the source, write the quantized checkpoint into `staging`, measure it; the report."""
    from llmopt.evaluate.perplexity import perplexity

    # The source is the natural reference: what the checkpoint should still predict.
    reference = str(model_dir) if config.kl_divergence else None
    measured = "perplexity, KL divergence" if reference else "perplexity"
    windows = (config.calib, config.eval_seq_len, config.eval_windows)
    with step(f"{measured} and decode speed before"):
        ppl_before = perplexity(str(model_dir), *windows, reference=reference)
        speed_before = decode_speed(model_dir)
    with step(
        f"{config.method.upper()} {config.bits}-bit on {len(samples)} samples of {config.seq_len} tokens"
    ):
        seconds = run_oneshot(model_dir, staging, tokenizer, samples, config, group_size)
    with step(f"{measured} and decode speed after"):
        ppl_after = perplexity(str(staging), *windows, reference=reference)
        speed_after = decode_speed(staging)
    return QuantReport(
        method=config.method,
        bits=config.bits,
        group_size=group_size,
        calibration_samples=len(samples),
        seq_len=config.seq_len,
        seconds=round(seconds, 1),
        size_before_mb=round(checkpoint_size_mb(model_dir), 1),
        size_after_mb=round(checkpoint_size_mb(staging), 1),
        perplexity_before=round(ppl_before.perplexity, 4),
        perplexity_after=round(ppl_after.perplexity, 4),
        decode_tok_s_before=round(speed_before, 1),
        decode_tok_s_after=round(speed_after, 1),
        source=str(model_dir),
        out=str(config.out.resolve()),
        scheme=json.loads((staging / "config.json").read_text())["quantization_config"],
        kl_divergence_before=ppl_before.kl_divergence,
        kl_divergence_after=ppl_after.kl_divergence,
    )


def run_oneshot(
    model_dir: Path,
    out: Path,
    tokenizer,
    samples: list[list[int]],
    config: QuantizeConfig,
    group_size: int | None,
) -> float:
    """Calibrate, quantize and save with llm-compressor; return the seconds oneshot took."""
    # llm-compressor logs every layer's GPTQ error and, on import, that there is no GPU: keep its
    # console to errors (a user's own LLM_COMPRESSOR_LOG_LEVEL wins); our progress shows the steps.
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.logger import LoggerConfig, configure_logger
    from llmcompressor.pipelines.cache import IntermediatesCache

    from llmopt.checkpoints import transformers_model

    configure_logger(
        LoggerConfig(console_log_level=os.environ["LLM_COMPRESSOR_LOG_LEVEL"], metrics_disabled=True)
    )
    no_pinning = nullcontext()
    if config.method == "awq" and not torch.cuda.is_available():
        # llm-compressor's AWQ pins cached activations for host-to-GPU copies, which fails on a machine
        # with no accelerator (llm-compressor 0.14); pinning only helps GPU transfers, so skip it, for
        # this oneshot call only (the class is llm-compressor's, shared with anything else in-process).
        no_pinning = mock.patch.object(IntermediatesCache, "pin_memory", lambda self, *args, **kwargs: None)
    model = transformers_model(model_dir)  # a GGUF dequantized in memory, never written in fp32
    dataset = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    with no_pinning, tempfile.TemporaryDirectory(prefix="llmopt-config-") as config_dir:
        # llm-compressor reads the source's config.json from the folder the model names (to refuse an
        # already quantized one, and again when saving); a GGUF's model has none, so it names a folder
        # holding its config only.
        model.config.save_pretrained(config_dir)
        model.name_or_path = model.config._name_or_path = config_dir
        start = time.perf_counter()
        oneshot(
            model=model,
            processor=tokenizer,  # given, not looked up in that folder
            dataset=dataset,
            recipe=recipe(config.method, config.bits, group_size),
            max_seq_length=config.seq_len,
            num_calibration_samples=len(samples),
            pipeline=PIPELINES[config.method],
        )
        seconds = time.perf_counter() - start
        model.save_pretrained(out, save_compressed=True)  # reads the config folder too
    tokenizer.save_pretrained(out)
    return seconds
