"""Speculative decoding: greedy output is unchanged token for token, sampling keeps the target's
distribution, bad configurations fail at start-up."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.policy import ForcedAcceptance, trim_forced
from llmopt.engine.spec_decode.verify import verify
from tests.conftest import PROMPTS

# Prompts whose continuations repeat what came before, so that n-gram lookups find proposals.
REPETITIVE = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5,",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Roses are red, violets are blue. Roses are red, violets are",
]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0)


def save_tiny_llama(folder, model_dir, vocab_size: int) -> None:
    """A real, loadable 2-layer Llama with random weights and the target's tokenizer files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, folder / name)


@pytest.fixture(scope="module")
def tiny_draft(model_dir, tmp_path_factory):
    """The target's vocabulary, random weights: its proposals are mostly rejected."""
    folder = tmp_path_factory.mktemp("tiny-draft")
    save_tiny_llama(folder, model_dir, vocab_size=49152)
    return folder


def check_equal(llm: LLM, hf_greedy, prompts: list[str], n: int) -> None:
    ids = [llm.tokenizer.encode(p) for p in prompts]
    outputs = llm.generate(ids, greedy(n))
    for prompt_ids, out in zip(ids, outputs):
        assert out.token_ids == hf_greedy(tuple(prompt_ids), n)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ngram_greedy_equals_transformers(model_dir, hf_greedy, k):
    llm = LLM(
        str(model_dir), num_kv_blocks=256, speculative_config={"method": "ngram", "num_speculative_tokens": k}
    )
    check_equal(llm, hf_greedy, REPETITIVE + PROMPTS[:4], 32)
    stats = llm.engine.stats()
    assert stats.spec_drafts > 0 and stats.spec_accepted_tokens > 0
    assert len(stats.spec_acceptance_by_position) == k
    # A prefix-cache hit on the second round, with speculation.
    hits = llm.engine.block_manager.prefix_cache_hits
    check_equal(llm, hf_greedy, [REPETITIVE[0] + " jumps over"], 16)
    assert llm.engine.block_manager.prefix_cache_hits > hits


def test_ngram_with_preemption_and_chunked_prefill(model_dir, hf_greedy):
    llm = LLM(
        str(model_dir),
        num_kv_blocks=14,
        max_num_batched_tokens=32,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    check_equal(llm, hf_greedy, REPETITIVE + PROMPTS[4:8], 40)
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_greedy_equals_transformers(model_dir, hf_greedy, tiny_draft, k):
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(tiny_draft), "num_speculative_tokens": k},
    )
    check_equal(llm, hf_greedy, REPETITIVE[:2] + PROMPTS[:4], 24)
    assert llm.engine.stats().spec_drafts > 0
    assert not llm.engine.proposer.states, "finished requests release their draft KV blocks"
    draft_bm = llm.engine.proposer.block_manager
    assert draft_bm.num_free_blocks == draft_bm.num_blocks


def test_the_target_as_its_own_draft_accepts_everything(model_dir, hf_greedy):
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(model_dir), "num_speculative_tokens": 3},
    )
    check_equal(llm, hf_greedy, PROMPTS[:3], 20)
    stats = llm.engine.stats()
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens > 0  # all accepted, bonus every step
    # k = 3 except near max_tokens, where fewer are proposed: each step yields its proposals + 1.
    assert stats.spec_mean_acceptance_length == pytest.approx(1 + stats.spec_draft_tokens / stats.spec_drafts)
    assert 3.5 < stats.spec_mean_acceptance_length <= 4


@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 3}, "method must be one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, ">= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "unknown speculative config keys"),
        ({"method": "draft", "num_speculative_tokens": 2}, 'needs "model"'),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
            "lookup",
        ),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_configs_fail_with_one_clear_error(config, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(config)


def test_a_draft_with_another_vocabulary_is_refused(model_dir, tmp_path):
    save_tiny_llama(tmp_path, model_dir, vocab_size=1000)
    spec = json.dumps({"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(model_dir), num_kv_blocks=32, speculative_config=spec)


def test_json_config_takes_the_dataclass_defaults():
    parsed = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert parsed == SpeculativeConfig("ngram", 3)
    assert parsed.prompt_lookup_min == 2


def test_ngram_lookup_finds_the_latest_longest_match():
    proposer = NgramProposer(SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3))
    assert proposer.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]
    assert proposer.lookup([5, 6, 7], 2) == []
    assert proposer.lookup([4, 4], 2) == [4]


# ---- the rejection sampler keeps the target distribution ------------------------------------------

TARGET_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0])
P = TARGET_LOGITS.softmax(-1).numpy()


def wrong_verify(logits, draft, draft_probs, seq, stop_ids):
    """A deliberately wrong sampler: accept proposals whenever they are plausible at all."""
    return [draft[0]] if float(logits[0].softmax(-1)[draft[0]]) > 0.05 else [int(logits[0].argmax())], 1


def first_token_frequencies(verifier, draft_probs: torch.Tensor | None, n: int = 20000) -> np.ndarray:
    seq = Sequence("r", [1, 2, 3], SamplingParams(temperature=1.0, max_tokens=8), seed=123)
    generator = torch.Generator().manual_seed(7)
    counts = np.zeros(len(P))
    logits = TARGET_LOGITS.repeat(2, 1)
    for _ in range(n):
        if draft_probs is None:
            draft = [3]  # an n-gram proposal: certain, and unlikely under the target
        else:
            draft = [int(torch.multinomial(draft_probs[0], 1, generator=generator))]
        tokens, _ = verifier(logits.clone(), draft, draft_probs, seq, set())
        counts[tokens[0]] += 1
    return counts


def chi_square(counts: np.ndarray) -> float:
    expected = P * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# 5 degrees of freedom: the 99.9th percentile of chi-square is 20.5.
BOUND = 20.5


@pytest.mark.parametrize("draft_probs", [None, torch.tensor([[0.05, 0.05, 0.1, 0.5, 0.2, 0.1]])])
@pytest.mark.slow
def test_rejection_sampling_follows_the_target_distribution(draft_probs):
    assert chi_square(first_token_frequencies(verify, draft_probs)) < BOUND
    assert chi_square(first_token_frequencies(wrong_verify, draft_probs)) > BOUND


def accept_everything(logits, draft, draft_probs, seq, stop_ids, greedy=None):
    """A deliberately wrong verifier, wired into the engine: every proposal is taken."""
    return draft + [int(logits[len(draft)].argmax())], len(draft)


def test_sampled_outputs_agree_with_and_without_speculation(model_dir, tmp_path, monkeypatch):
    """At temperature 1, the engine with n-gram speculation samples what it samples without: the share of
    second tokens that copy the prompt's continuation (what n-gram proposes) is the same, while an engine
    whose verifier accepts every proposal copies nearly always. A random 64-token model: its
    distributions are wide, so the proposals are plausible and far from certain."""
    folder = tmp_path / "tiny"
    save_tiny_llama(folder, model_dir, vocab_size=64)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()
    follows = {a: b for a, b in zip(order, order[1:])}
    prompt = order + order  # every token has an earlier occurrence: one-token lookups always propose

    def copy_rate(spec) -> float:
        llm = LLM(str(folder), num_kv_blocks=2048, max_num_seqs=64, speculative_config=spec)
        params = [SamplingParams(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True) for s in range(1000)]
        outs = llm.generate([prompt] * 1000, params)
        return float(np.mean([follows.get(o.token_ids[0]) == o.token_ids[1] for o in outs]))

    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 1}
    base, spec = copy_rate(None), copy_rate(ngram)
    assert abs(spec - base) < 0.05, (base, spec)
    monkeypatch.setattr("llmopt.engine.spec_decode.speculator.verify", accept_everything)
    assert copy_rate(ngram) > base + 0.5


def test_an_int4_copy_of_the_target_as_draft_equals_transformers(model_dir, hf_greedy, gptq_dir):
    """A good but imperfect draft: in one draft batch, sequences that accepted everything (their draft
    has two tokens to catch up) run beside ones that had a rejection (one token)."""
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(gptq_dir), "num_speculative_tokens": 3},
    )
    proposer = llm.engine.proposer
    propose = proposer.propose
    catch_up: list[set[int]] = []  # per draft batch: tokens each known sequence's draft is behind

    def recording(seqs, ks):
        known = [s for s in seqs if s.request_id in proposer.states]
        computed = [min(proposer.states[s.request_id].num_computed_tokens, len(s) - 1) for s in known]
        catch_up.append({len(s) - c for s, c in zip(known, computed)})
        return propose(seqs, ks)

    proposer.propose = recording
    check_equal(llm, hf_greedy, REPETITIVE[:2] + PROMPTS[:4], 24)
    stats = llm.engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert any({1, 2} <= behind for behind in catch_up), "no draft batch mixed accepted and rejected"


# ---- how many forced tokens a step verifies -----------------------------------------------------------


def forced_seqs(count: int, forced: int) -> list[Sequence]:
    seqs = [Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=32), seed=0) for i in range(count)]
    for seq in seqs:
        seq.spec_token_ids, seq.spec_num_forced = list(range(10, 10 + forced)), forced
    return seqs


def measured_acceptance() -> ForcedAcceptance:
    """Per position as measured at batch 8 on the benchmark's schema: 88, 83, 69, 61, 61, 56 %."""
    acceptance = ForcedAcceptance()
    for position, rate in enumerate([0.88, 0.83, 0.69, 0.61, 0.61, 0.56]):
        acceptance.proposed_at[position], acceptance.accepted_at[position] = 1000, int(1000 * rate)
    return acceptance


def test_forced_proposals_are_kept_where_rows_are_cheap_and_cut_where_the_batch_is_arithmetic_bound():
    [alone] = forced_seqs(1, 6)
    trim_forced([alone], measured_acceptance())
    assert alone.spec_token_ids == list(range(10, 16)) and alone.spec_num_forced == 6
    batch = forced_seqs(8, 6)
    trim_forced(batch, measured_acceptance())
    assert [len(s.spec_token_ids) for s in batch] == [2] * 8  # the positions accepted 80 % and more
    assert all(s.spec_num_forced == 2 and s.spec_token_ids == [10, 11] for s in batch)
    fresh = forced_seqs(8, 6)
    trim_forced(fresh, ForcedAcceptance())  # nothing verified yet: proposals are taken as accepted
    assert all(len(s.spec_token_ids) == 6 for s in fresh)
