"""What `llmopt quantize` reports about a checkpoint, before and after: size, perplexity, the KL divergence
of its next-token distribution from the source's in float32, decode speed, written beside the checkpoint
as quant_report.json."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmopt.checkpoints import QUANT_REPORT_FILE as REPORT_FILE
from llmopt.evaluate.kl_divergence import KLStats


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
    # From the source run in float32 on the perplexity windows: "before" is the source as the engine runs
    # it by default (0 where that is float32 too), "after" the checkpoint. None: --no-kld.
    kl_divergence_before: KLStats | None = None
    kl_divergence_after: KLStats | None = None


def write_report(folder: Path, report: QuantReport) -> None:
    (folder / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")


def checkpoint_size_mb(checkpoint: Path) -> float:
    files = [checkpoint] if checkpoint.is_file() else checkpoint.glob("*.safetensors")
    return sum(p.stat().st_size for p in files) / 1e6


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
