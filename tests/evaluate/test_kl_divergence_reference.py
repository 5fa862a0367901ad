"""llmopt's KLD statistics against an independent float64 computation, on shapes and distributions that
test_kl_divergence.py's random-logits test leaves out (one row over the bundled model's full vocabulary, a
few rows, several chunks; peaked rows, nearly identical rows and a peaked model against a flat reference):
each row's token_kld against torch's kl_div, the percentiles against numpy.percentile's linear method
(what llmopt's percentile documents), top-1 agreement and Δp by hand. No model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmopt.evaluate.kl_divergence import ROWS_PER_CHUNK, kl_stats, token_kld

BUNDLED_VOCAB = 49152


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def peaked(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits whose top token holds almost all the probability (as a confident model's)."""
    logits = torch.randn(rows, vocab, generator=generator(seed))
    logits[torch.arange(rows), torch.randint(vocab, (rows,), generator=generator(seed + 1))] += 25.0
    return logits


PEAKED_ROWS = 2 * ROWS_PER_CHUNK + 9  # three chunks
BASE = torch.randn(64, 2000, generator=generator(7)) * 3
CASES = {  # name: (model logits, reference logits)
    "full vocabulary, one row": (
        torch.randn(1, BUNDLED_VOCAB, generator=generator(0)) * 4,
        torch.randn(1, BUNDLED_VOCAB, generator=generator(1)) * 4,
    ),
    "few rows, small vocabulary": (
        torch.randn(7, 32, generator=generator(2)),
        torch.randn(7, 32, generator=generator(3)),
    ),
    "peaked, three chunks": (
        peaked(PEAKED_ROWS, 500, seed=4) + torch.randn(PEAKED_ROWS, 500, generator=generator(6)) * 0.3,
        peaked(PEAKED_ROWS, 500, seed=4),
    ),
    "nearly identical": (
        BASE + torch.randn(64, 2000, generator=generator(10)) * 1e-3,
        BASE,
    ),
    "peaked model, flat reference": (peaked(40, 300, seed=8), torch.zeros(40, 300)),
}


def reference_klds(logits: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """KL(P_ref || P_model) per row in float64 by torch's kl_div (input: the model's log-probabilities)."""
    log_q = F.log_softmax(logits.double(), -1)
    log_p = F.log_softmax(reference.double(), -1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


@pytest.mark.parametrize("case", CASES)
def test_token_kld_is_kl_div_row_by_row(case):
    logits, reference = CASES[case]
    ours = token_kld(F.log_softmax(logits.double(), -1), F.log_softmax(reference.double(), -1))
    expected = reference_klds(logits, reference)
    assert ours.dtype == torch.float32 and ours.shape == (len(logits),)
    torch.testing.assert_close(ours.double(), expected.clamp_min(0), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_kl_stats_match_numpy_and_hand_counts(case):
    logits, reference = CASES[case]
    rows = len(logits)
    targets = torch.randint(logits.shape[1], (rows,), generator=generator(9))
    targets[::2] = reference.argmax(-1)[::2]  # half the text is the reference's first choice: Δp matters
    stats = kl_stats(logits, reference, targets)
    kld = reference_klds(logits, reference).clamp_min(0).numpy()
    p_model = F.softmax(logits.double(), -1)[torch.arange(rows), targets]
    p_ref = F.softmax(reference.double(), -1)[torch.arange(rows), targets]
    expected = {
        "mean": kld.mean(),
        "median": np.percentile(kld, 50, method="linear"),
        "p99": np.percentile(kld, 99, method="linear"),
        "p999": np.percentile(kld, 99.9, method="linear"),
        "max": kld.max(),
        "top1_agreement": sum(int(a == b) for a, b in zip(logits.argmax(-1), reference.argmax(-1))) / rows,
        "delta_p_mean": float((p_model - p_ref).sum()) / rows,
    }
    assert stats.tokens == rows
    for name, value in expected.items():
        assert getattr(stats, name) == pytest.approx(float(value), rel=1e-5, abs=1e-9), name
