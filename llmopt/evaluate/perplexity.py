"""Perplexity on held-out text, through our engine's forward or through transformers, on the same
windows, so a quantized checkpoint's quality can be checked in the runtime that will serve it."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from llmopt.evaluate.data import Window, eval_windows, split_tokens

BACKENDS = ("engine", "transformers")


@dataclass
class EvalResult:
    model: str
    backend: str
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token
    tokens: int  # scored tokens
    windows: int
    seq_len: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def window_nll(logits: torch.Tensor, window: Window) -> tuple[float, int]:
    """Summed NLL of the tokens `window` scores, from fp32 logits at every position of the window."""
    targets = torch.tensor(window.token_ids)
    first = max(1, window.num_context)  # logits at j - 1 predict token j
    nll = torch.nn.functional.cross_entropy(logits[first - 1 : -1], targets[first:], reduction="sum")
    return float(nll), len(window.token_ids) - first


def engine_scorer(
    model_dir: Path,
    seq_len: int,
    model: str | None = None,
    dtype: str = "auto",
    lm_head_dtype: str = "auto",
):
    """Our engine's logits for a text; `model` names the GGUF file that dtype "auto" reads natively."""
    from llmopt.engine.block_manager import num_blocks_for
    from llmopt.engine.config import EngineConfig
    from llmopt.engine.model_runner import ModelRunner

    blocks = num_blocks_for(seq_len, 16)
    config = EngineConfig(model, dtype, num_kv_blocks=blocks, block_size=16, lm_head_dtype=lm_head_dtype)
    runner = ModelRunner(config, model_dir, max_model_len=seq_len)
    return runner.prompt_logits


def transformers_scorer(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.inference_mode()
    def score(token_ids: list[int]) -> torch.Tensor:
        return model(torch.tensor([token_ids])).logits[0]

    return score


def perplexity(
    model: str | None,
    data: Path | None = None,
    seq_len: int = 512,
    num_windows: int = 8,
    backend: str = "engine",
    dtype: str = "auto",
    lm_head_dtype: str = "auto",
) -> EvalResult:
    """Perplexity of `model` on the evaluation half of `data` (default: the built-in corpus)."""
    from llmopt.checkpoints import load_tokenizer, resolve_model

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if seq_len < 2 or num_windows < 1:
        raise ValueError("seq_len must be at least 2 and windows at least 1")
    model_dir = resolve_model(model)
    windows = eval_windows(split_tokens(load_tokenizer(model_dir), data).evaluation, seq_len, num_windows)
    start = time.perf_counter()
    if backend == "engine":
        score = engine_scorer(model_dir, seq_len, model, dtype, lm_head_dtype)
    else:
        score = transformers_scorer(model_dir)
    total_nll, total_tokens = 0.0, 0
    for window in windows:
        nll, count = window_nll(score(window.token_ids), window)
        total_nll += nll
        total_tokens += count
    mean = total_nll / total_tokens
    return EvalResult(
        model=str(model_dir),
        backend=backend,
        perplexity=math.exp(mean),
        nll=mean,
        tokens=total_tokens,
        windows=len(windows),
        seq_len=seq_len,
        seconds=time.perf_counter() - start,
    )
