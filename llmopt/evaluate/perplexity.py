"""Perplexity on held-out text, through our engine's forward or through transformers, on the same
windows, so a quantized checkpoint's quality can be checked in the runtime that will serve it; with a
reference model, also the KL divergence of the model's next-token distribution from the reference's
(kl_divergence.py), the reference run through our engine in float32 on the same windows."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from llmopt.evaluate.eval_text import Window, eval_windows, split_tokens
from llmopt.evaluate.kl_divergence import KLAccumulator, KLStats

BACKENDS = ("engine", "transformers")
Scorer = Callable[[list[int]], torch.Tensor]  # token ids -> fp32 logits [len, vocab]
REFERENCE_DTYPE = "float32"  # the exact reference, as llama.cpp's KLD base is the unquantized model


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
    reference: str | None = None  # the reference model's folder, when one was compared
    reference_perplexity: float | None = None  # the reference's on the same windows
    kl_divergence: KLStats | None = None  # of the model's next-token distribution from the reference's

    def to_dict(self) -> dict:
        return asdict(self)


def scored(logits: torch.Tensor, window: Window) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a window's logits that predict the tokens it scores, and those tokens."""
    first = max(1, window.num_context)  # logits at j - 1 predict token j
    return logits[first - 1 : -1], torch.tensor(window.token_ids[first:])


def window_nll(logits: torch.Tensor, window: Window) -> tuple[float, int]:
    """Summed NLL of the tokens `window` scores, from fp32 logits at every position of the window."""
    rows, targets = scored(logits, window)
    return float(torch.nn.functional.cross_entropy(rows, targets, reduction="sum")), len(targets)


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
    from llmopt.checkpoints import transformers_model

    model = transformers_model(model_dir).eval()

    @torch.inference_mode()
    def score(token_ids: list[int]) -> torch.Tensor:
        return model(torch.tensor([token_ids])).logits[0]

    return score


def reference_scorer(
    reference: str, data: Path | None, token_ids: list[int], seq_len: int
) -> tuple[Path, Scorer]:
    """The reference's folder and its float32 logits through our engine. Its tokenizer must split the text
    into the same tokens as the model's: otherwise the two distributions are over different vocabularies."""
    from llmopt.checkpoints import load_tokenizer, resolve_model

    reference_dir = resolve_model(reference)
    if split_tokens(load_tokenizer(reference_dir), data).evaluation != token_ids:
        raise ValueError(
            f"the reference {reference} tokenizes the text differently from the model: "
            "the KL divergence compares distributions over one vocabulary"
        )
    # Its output layer in float32 too: `auto` would make it int8 for a quantized reference.
    return reference_dir, engine_scorer(reference_dir, seq_len, reference, REFERENCE_DTYPE, REFERENCE_DTYPE)


@dataclass
class WindowSums:
    """What the windows add up to: the model's and the reference's NLL, and the KL statistics."""

    nll: float = 0.0
    reference_nll: float = 0.0
    tokens: int = 0
    kl: KLAccumulator = field(default_factory=KLAccumulator)


def score_windows(score: Scorer, windows: list[Window], reference_score: Scorer | None = None) -> WindowSums:
    """Each window through the model (and the reference): one window's logits in memory at a time."""
    sums = WindowSums()
    for window in windows:
        logits = score(window.token_ids)
        nll, count = window_nll(logits, window)
        sums.nll += nll
        sums.tokens += count
        if reference_score is None:
            continue
        reference_logits = reference_score(window.token_ids)
        sums.reference_nll += window_nll(reference_logits, window)[0]
        rows, targets = scored(logits, window)
        sums.kl.add(rows, scored(reference_logits, window)[0], targets)
    return sums


def perplexity(
    model: str | None,
    data: Path | None = None,
    seq_len: int = 512,
    num_windows: int = 8,
    backend: str = "engine",
    dtype: str = "auto",
    lm_head_dtype: str = "auto",
    reference: str | None = None,
) -> EvalResult:
    """Perplexity of `model` on the evaluation half of `data` (default: the built-in corpus); with
    `reference`, also its KL divergence from that model (run in float32 through our engine)."""
    from llmopt.checkpoints import load_tokenizer, resolve_model

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if seq_len < 2 or num_windows < 1:
        raise ValueError("seq_len must be at least 2 and windows at least 1")
    model_dir = resolve_model(model)
    ids = split_tokens(load_tokenizer(model_dir), data).evaluation
    windows = eval_windows(ids, seq_len, num_windows)
    start = time.perf_counter()
    reference_dir, reference_score = (
        reference_scorer(reference, data, ids, seq_len) if reference else (None, None)
    )
    if backend == "engine":
        score = engine_scorer(model_dir, seq_len, model, dtype, lm_head_dtype)
    else:
        score = transformers_scorer(model_dir)
    sums = score_windows(score, windows, reference_score)
    compared = reference_score is not None
    return EvalResult(
        model=str(model_dir),
        backend=backend,
        perplexity=math.exp(sums.nll / sums.tokens),
        nll=sums.nll / sums.tokens,
        tokens=sums.tokens,
        windows=len(windows),
        seq_len=seq_len,
        seconds=time.perf_counter() - start,
        reference=str(reference_dir) if compared else None,
        reference_perplexity=math.exp(sums.reference_nll / sums.tokens) if compared else None,
        kl_divergence=sums.kl.stats() if compared else None,
    )
