"""`llmopt quantize`: GPTQ, AWQ or INT8 with llm-compressor, written as a compressed-tensors checkpoint
(what vLLM loads) with a quality and speed report.

llm-compressor's default pipeline traces the model and calibrates it layer by layer; on this 2-core CPU
that took over 30 minutes for GPTQ on a 135M model. The "basic" pipeline runs the calibration samples
through the whole model once and compresses every layer at the end: about a minute here. AWQ keeps the
sequential pipeline (its grid search needs it) and so gets a smaller default calibration set.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

METHODS = ("gptq", "awq", "int8")
BITS = {"gptq": (4, 8), "awq": (4,), "int8": (8,)}
# Default group size at 4 bits: the first of these that divides every quantized layer's input size.
# AWQ prefers small groups: on SmolLM2-135M, group 32 gave perplexity +10.5 % against +16.9 % at group 64
# (8 samples each); GPTQ's error feedback does well at 64 (+7.8 %).
GROUP_SIZES = {"gptq": (128, 64, 32), "awq": (32, 64, 128), "int8": (128, 64, 32)}
REPORT_FILE = "quant_report.json"
# GPTQ and INT8 calibrate in one pass over the whole model ("basic"): about a minute here instead of
# 30. AWQ's scale search needs each layer's inputs as the layers before it were smoothed: sequential.
PIPELINES = {"gptq": "basic", "awq": "sequential", "int8": "basic"}
# AWQ's grid search runs every layer 20 times over the samples: 8 x 256 tokens take about 3 minutes here.
CALIBRATION_SAMPLES = {"gptq": 64, "awq": 8, "int8": 8}


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


@dataclass
class QuantReport:
    method: str
    bits: int
    group_size: int | None  # None: one scale per output channel
    calibration_samples: int
    seq_len: int
    seconds: float  # calibration + quantization (llm-compressor's oneshot)
    size_before_mb: float
    size_after_mb: float
    perplexity_before: float
    perplexity_after: float
    decode_tok_s_before: float
    decode_tok_s_after: float
    source: str
    out: str
    scheme: dict = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, before, after) rows for the printed table."""

        def change(before: float, after: float) -> str:
            return f"{(after / before - 1) * 100:+.1f} %"

        return [
            ("size (MB)", f"{self.size_before_mb:.1f}", f"{self.size_after_mb:.1f}"),
            ("perplexity", f"{self.perplexity_before:.3f}", f"{self.perplexity_after:.3f}"),
            ("  change", "", change(self.perplexity_before, self.perplexity_after)),
            ("decode tok/s (batch 1)", f"{self.decode_tok_s_before:.1f}", f"{self.decode_tok_s_after:.1f}"),
            ("  speed-up", "", f"{self.decode_tok_s_after / self.decode_tok_s_before:.2f}x"),
        ]


def quantized_input_sizes(model_dir: Path) -> dict[str, int]:
    """Input size of each kind of linear layer llm-compressor quantizes, from config.json."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    return {
        "q/k/v/gate/up_proj": hidden,
        "o_proj": config["num_attention_heads"] * head_dim,
        "down_proj": config["intermediate_size"],
    }


def choose_group_size(config: QuantizeConfig, model_dir: Path) -> int | None:
    """The group size to use (None = per channel); raises before any work when it cannot work."""
    sizes = quantized_input_sizes(model_dir)
    valid = [g for g in GROUP_SIZES[config.method] if all(size % g == 0 for size in sizes.values())]
    if config.group_size is None:
        if config.bits == 8:
            return None
        if not valid:
            raise ValueError(f"no group size of 128, 64 or 32 divides the layer input sizes {sizes}")
        return valid[0]
    if config.group_size < 1 or any(size % config.group_size for size in sizes.values()):
        sizes_text = ", ".join(f"{name} {size}" for name, size in sizes.items())
        raise ValueError(
            f"--group-size {config.group_size} must divide every quantized layer's input size "
            f"({sizes_text}); valid choices include {', '.join(map(str, valid)) or 'none of 128/64/32'}"
        )
    return config.group_size


def recipe(method: str, bits: int, group_size: int | None):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=bits,
        type="int",
        # At 4 bits a zero point per group loses much less on small models (GPTQ on SmolLM2-135M,
        # group 64: perplexity +10 % with zero points, +28 % symmetric); 8 bits needs none.
        symmetric=bits == 8,
        strategy="channel" if group_size is None else "group",
        group_size=group_size,
    )
    groups = {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        return GPTQModifier(config_groups=groups, ignore=["lm_head"])
    from llmcompressor.modifiers.quantization import QuantizationModifier

    quantization = QuantizationModifier(config_groups=groups, ignore=["lm_head"])
    if method == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        return [AWQModifier(), quantization]  # AWQ smooths activation outliers, then weights are rounded
    return quantization


def checkpoint_size_mb(model_dir: Path) -> float:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) / 1e6


def decode_speed(model_dir: Path, tokens: int = 64) -> float:
    """Batch-1 greedy decode tok/s in our engine (prefill excluded)."""
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams

    llm = LLM(str(model_dir), num_kv_blocks=64)
    prompt = "Write a short story about a lighthouse keeper."
    llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))  # warm-up
    prefill = time.perf_counter()
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    prefill = time.perf_counter() - prefill
    start = time.perf_counter()
    [out] = llm.generate(prompt, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    return (len(out.token_ids) - 1) / (time.perf_counter() - start - prefill)


def writable_staging_dir(out: Path, overwrite: bool) -> Path:
    """A temporary folder beside `out` (the final rename is atomic within one file system)."""
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists: choose another --out or pass --overwrite")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as exc:
        raise ValueError(f"cannot write to {out.parent}: {exc.strerror}") from None


def publish(staging: Path, out: Path) -> None:
    """Move the finished checkpoint into place; an old one (with --overwrite) is replaced whole."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}-old-{os.getpid()}")
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def quantize(
    config: QuantizeConfig, step: Callable[[str], AbstractContextManager] = lambda _: nullcontext()
) -> QuantReport:
    """Quantize `config.model` into `config.out`; `step(description)` wraps each long step (progress)."""
    from llmopt.checkpoints import load_tokenizer, resolve_model
    from llmopt.evaluate.data import calibration_samples, split_tokens
    from llmopt.evaluate.perplexity import perplexity

    model_dir = resolve_model(config.model)
    group_size = choose_group_size(config, model_dir)
    tokenizer = load_tokenizer(model_dir)
    samples = calibration_samples(
        split_tokens(tokenizer, config.calib).calibration, config.calib_samples, config.seq_len
    )
    staging = writable_staging_dir(config.out, config.overwrite)
    try:
        with step("perplexity and decode speed before"):
            ppl_before = perplexity(str(model_dir), config.calib, config.eval_seq_len, config.eval_windows)
            speed_before = decode_speed(model_dir)
        with step(
            f"{config.method.upper()} {config.bits}-bit on {len(samples)} samples of {config.seq_len} tokens"
        ):
            seconds = run_oneshot(model_dir, staging, tokenizer, samples, config, group_size)
        with step("perplexity and decode speed after"):
            ppl_after = perplexity(str(staging), config.calib, config.eval_seq_len, config.eval_windows)
            speed_after = decode_speed(staging)
        report = QuantReport(
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
        )
        (staging / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
        publish(staging, config.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


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
    from transformers import AutoModelForCausalLM

    configure_logger(
        LoggerConfig(console_log_level=os.environ["LLM_COMPRESSOR_LOG_LEVEL"], metrics_disabled=True)
    )
    if config.method == "awq" and not torch.cuda.is_available():
        # llm-compressor's AWQ pins cached activations for host-to-GPU copies, which fails on a machine
        # with no accelerator (llm-compressor 0.14); pinning only helps GPU transfers, so skip it.
        from llmcompressor.pipelines.cache import IntermediatesCache

        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    start = time.perf_counter()
    oneshot(
        model=model,
        dataset=dataset,
        recipe=recipe(config.method, config.bits, group_size),
        max_seq_length=config.seq_len,
        num_calibration_samples=len(samples),
        pipeline=PIPELINES[config.method],
    )
    seconds = time.perf_counter() - start
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    return seconds
