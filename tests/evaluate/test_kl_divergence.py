"""KL divergence of a model from a reference: the statistics against a direct torch computation on random
logits (no model), the windows' wiring with stand-in scorers (no model), and on the real bundled model
through our engine (its native Q4_1 GGUF against the fp32 copy) against transformers' fp32 logits of the
same windows, and `llmopt eval --reference` as a user runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmopt.checkpoints import DEFAULT_MODEL, bundled_gguf_path
from llmopt.evaluate import perplexity as perplexity_module
from llmopt.evaluate.eval_text import eval_windows, split_tokens
from llmopt.evaluate.kl_divergence import ROWS_PER_CHUNK, KLAccumulator, KLStats, kl_stats, percentile
from llmopt.evaluate.perplexity import perplexity, score_windows, scored
from tests.conftest import llmopt

VOCAB = 500


def random_logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def direct_stats(logits: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """The same figures straight from torch's own kl_div, in float64, and torch.quantile."""
    log_q, log_p = F.log_softmax(logits.double(), -1), F.log_softmax(reference.double(), -1)
    kld = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)  # KL(P_ref || P_model)
    rows = torch.arange(len(targets))
    return {
        "mean": float(kld.mean()),
        "median": float(torch.quantile(kld, 0.5)),
        "p99": float(torch.quantile(kld, 0.99)),
        "p999": float(torch.quantile(kld, 0.999)),
        "max": float(kld.max()),
        "top1_agreement": float((logits.argmax(-1) == reference.argmax(-1)).double().mean()),
        "delta_p_mean": float((log_q[rows, targets].exp() - log_p[rows, targets].exp()).mean()),
    }


def test_the_statistics_are_torchs_own_kl_divergence():
    rows = ROWS_PER_CHUNK + 44  # two chunks
    reference = random_logits(rows, seed=0)
    logits = reference + random_logits(rows, seed=1, scale=0.8)  # a noisy copy: most argmaxes agree
    targets = torch.randint(VOCAB, (rows,), generator=torch.Generator().manual_seed(2))
    stats = kl_stats(logits, reference, targets)
    expected = direct_stats(logits, reference, targets)
    assert stats.tokens == rows
    for name, value in expected.items():
        assert getattr(stats, name) == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert 0 < stats.median < stats.mean < stats.p99 < stats.p999 < stats.max  # a right-skewed spread
    assert 0.3 < stats.top1_agreement < 1 and stats.delta_p_mean != 0


def test_identical_logits_diverge_by_nothing_and_always_agree():
    logits = random_logits(64, seed=3)
    stats = kl_stats(logits, logits.clone(), torch.arange(64))
    assert (stats.mean, stats.median, stats.p99, stats.p999, stats.max) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert stats.top1_agreement == 1.0 and stats.delta_p_mean == 0.0


def test_a_token_the_reference_rules_out_adds_nothing():
    """A -inf logit in both (a masked token) is no NaN; one only the model rules out is infinite."""
    reference = random_logits(4, seed=4)
    reference[:, 7] = float("-inf")
    logits = reference.clone()
    logits[:, :3] += 0.5
    first = torch.zeros(4, dtype=torch.long)
    stats = kl_stats(logits, reference, first)

    def without_7(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :7], x[:, 8:]], dim=1)

    assert stats.mean == pytest.approx(direct_stats(without_7(logits), without_7(reference), first)["mean"])
    logits[0, 0] = float("-inf")
    assert kl_stats(logits, reference, first).max == float("inf")


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert percentile(values, 0.5) == 2.5  # an even count: the middle two's mean
    assert (percentile(values, 0.0), percentile(values, 1.0)) == (1.0, 4.0)
    assert percentile(torch.arange(101.0), 0.99) == pytest.approx(99.0)
    spread = torch.rand(1000, generator=torch.Generator().manual_seed(5)).sort().values
    for fraction in (0.1, 0.5, 0.99, 0.999):
        assert percentile(spread, fraction) == pytest.approx(
            float(np.percentile(spread.numpy(), fraction * 100))
        )


def test_windows_streamed_equal_all_at_once():
    reference, logits = random_logits(90, seed=6), random_logits(90, seed=7)
    targets = torch.randint(VOCAB, (90,), generator=torch.Generator().manual_seed(8))
    streamed = KLAccumulator()
    for rows in (slice(0, 30), slice(30, 31), slice(31, 90)):
        streamed.add(logits[rows], reference[rows], targets[rows])
    assert streamed.stats().to_dict() == pytest.approx(kl_stats(logits, reference, targets).to_dict())
    assert len(streamed.klds) == 3 and all(k.dtype == torch.float32 for k in streamed.klds)


def test_other_vocabularies_or_no_positions_are_refused():
    with pytest.raises(ValueError, match="do not cover the same 4 positions"):
        kl_stats(random_logits(4, 0), random_logits(4, 1)[:, :-1], torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="no positions"):
        KLAccumulator().stats()


def stand_in(table: torch.Tensor):
    """A scorer whose logits at a position depend on the token there (an embedding lookup)."""
    return lambda token_ids: table[torch.tensor(token_ids)]


def test_the_windows_compare_exactly_the_positions_perplexity_scores():
    ids = torch.randint(VOCAB, (300,), generator=torch.Generator().manual_seed(9)).tolist()
    windows = eval_windows(ids, seq_len=128, num_windows=5, stride=64)  # overlapping: context rows
    model, reference = random_logits(VOCAB, seed=10), random_logits(VOCAB, seed=11)
    sums = score_windows(stand_in(model), windows, stand_in(reference))
    rows = [scored(model[torch.tensor(w.token_ids)], w) for w in windows]
    reference_rows = [scored(reference[torch.tensor(w.token_ids)], w)[0] for w in windows]
    expected = kl_stats(
        torch.cat([r for r, _ in rows]), torch.cat(reference_rows), torch.cat([t for _, t in rows])
    )
    assert sums.kl.stats().to_dict() == pytest.approx(expected.to_dict())
    assert expected.tokens == sums.tokens == len(ids) - 1
    assert sums.reference_nll > 0 and score_windows(stand_in(model), windows).kl.klds == []


# --- the real model through our engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compared():
    """`perplexity` of the default model (its GGUF, natively: dtype auto) against itself in float32 (the
    converted folder) on two windows, with every logits tensor the engine returned, by dtype."""
    logits: dict[str, list[torch.Tensor]] = {"auto": [], "float32": []}
    real = perplexity_module.engine_scorer

    def recording(model_dir, seq_len, model=None, dtype="auto", lm_head_dtype="auto"):
        score = real(model_dir, seq_len, model, dtype, lm_head_dtype)

        def record(token_ids: list[int]) -> torch.Tensor:
            logits[dtype].append(score(token_ids))
            return logits[dtype][-1]

        return record

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(perplexity_module, "engine_scorer", recording)
        result = perplexity(None, seq_len=128, num_windows=2, reference=DEFAULT_MODEL)
    return result, logits


@pytest.mark.model
def test_the_engines_kld_is_the_one_from_transformers_fp32_logits(compared, hf_model, llm):
    result, logits = compared
    assert len(logits["auto"]) == len(logits["float32"]) == 2
    windows = eval_windows(split_tokens(llm.tokenizer, None).evaluation, 128, 2)
    assert next(hf_model.parameters()).dtype == torch.float32
    model_rows, hf_rows, targets = [], [], []
    for window, ours_fp32, ours_auto in zip(windows, logits["float32"], logits["auto"]):
        with torch.inference_mode():
            theirs = hf_model(torch.tensor([window.token_ids])).logits[0].float()
        torch.testing.assert_close(ours_fp32, theirs, rtol=1e-5, atol=1e-4)  # the reference is exact
        rows, window_targets = scored(ours_auto, window)
        model_rows.append(rows)
        hf_rows.append(scored(theirs, window)[0])
        targets.append(window_targets)
    expected = kl_stats(torch.cat(model_rows), torch.cat(hf_rows), torch.cat(targets))
    hf_nll = F.cross_entropy(torch.cat(hf_rows), torch.cat(targets))
    assert result.reference_perplexity == pytest.approx(float(hf_nll.exp()), rel=1e-4)
    stats = result.kl_divergence
    assert stats.tokens == expected.tokens == result.tokens == 2 * 127
    for name in ("mean", "median", "p99", "p999", "max"):
        assert getattr(stats, name) == pytest.approx(getattr(expected, name), rel=1e-3), name
    assert stats.top1_agreement == pytest.approx(expected.top1_agreement, abs=1.5 / stats.tokens)
    assert stats.delta_p_mean == pytest.approx(expected.delta_p_mean, abs=1e-5)
    assert 0 < stats.mean < 1 and 0.5 < stats.top1_agreement < 1  # Q4_1 is close to fp32, not equal


@pytest.mark.model
@pytest.mark.model  # the real model, through the CLI
def test_eval_with_a_reference_prints_the_kld_and_its_json():
    args = ("eval", "--reference", DEFAULT_MODEL, "--windows", "1", "--seq-len", "128")
    shown = llmopt(*args)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert (
        lines[0].startswith("perplexity ") and f"KL divergence from {DEFAULT_MODEL} (float32)" in shown.stdout
    )
    values = {}
    for label in ("mean KLD", "median KLD", "99.0% KLD", "99.9% KLD", "max KLD", "top-1 agreement"):
        [line] = [line for line in lines if label in line]
        values[label] = float(line.split(label)[1].strip(" │|%"))
    assert 0 < values["median KLD"] < values["99.0% KLD"] <= values["99.9% KLD"] <= values["max KLD"]
    assert 50 < values["top-1 agreement"] < 100 and "mean Δp (next token)" in shown.stdout
    assert "reference perplexity" in shown.stdout and "127 tokens" in shown.stdout
    data = json.loads(llmopt(*args, "--json").stdout)
    assert data["kl_divergence"].keys() == KLStats.__dataclass_fields__.keys()
    # the reference is the bundled file itself, run in float32 (dequantized in memory)
    assert data["kl_divergence"]["tokens"] == 127 and data["reference"] == str(bundled_gguf_path())
    assert data["kl_divergence"]["mean"] == pytest.approx(values["mean KLD"], abs=1e-6)
