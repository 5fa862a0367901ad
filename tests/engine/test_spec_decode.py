"""Speculative decoding: greedy output is unchanged token for token, sampling keeps the target's
distribution, bad configurations fail at start-up."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.policy import (
    PRIOR_POSITIONS,
    ForcedAcceptance,
    ProposalAcceptance,
    RequestAcceptance,
    catch_up_pays,
    forced_offer,
    plan,
    proposal_room,
    proposer_offer,
    record_acceptance,
    settle,
)
from llmopt.engine.spec_decode.step_cost import StepCost
from llmopt.engine.spec_decode.verify import verify
from tests.conftest import PROMPTS
from tests.engine.free_rows import verifying_everything

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
    verifying_everything(llm)
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
    verifying_everything(llm)
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
    verifying_everything(llm)  # a draft as costly as the target never pays: the policy would not propose
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
            {"method": "draft", "model": "m", "num_speculative_tokens": 2, "draft_weights": "q2_k"},
            "q4_0, file",
        ),
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


@pytest.mark.model
def test_a_gguf_draft_runs_its_finer_blocks_as_q4_0_and_changes_no_greedy_token():
    """The bundled file as its own draft: by default its Q8_0 tied head runs as Q4_0 (its Q4_1 layers as
    they are), "file" keeps the file's; the target's greedy tokens are the same either way and without."""
    gguf = str(bundled_gguf_path())
    plain = LLM(gguf, num_kv_blocks=128, speculative_config="off")
    ids = [plain.tokenizer.encode(p) for p in PROMPTS[:3]]
    expected = [o.token_ids for o in plain.generate(ids, greedy(24))]
    for weights, head in (({}, "Q4_0"), ({"draft_weights": "file"}, "Q8_0")):
        spec = {"method": "draft", "model": gguf, "num_speculative_tokens": 3, **weights}
        llm = LLM(gguf, num_kv_blocks=128, speculative_config=spec)
        assert llm.engine.proposer.runner.model.lm_head_t.gguf.types == [head]
        assert [o.token_ids for o in llm.generate(ids, greedy(24))] == expected
        assert llm.engine.stats().spec_accepted_tokens > 0


def test_a_draft_with_another_vocabulary_is_refused(model_dir, tmp_path):
    save_tiny_llama(tmp_path, model_dir, vocab_size=1000)
    spec = json.dumps({"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(model_dir), num_kv_blocks=32, speculative_config=spec)


def test_json_config_takes_the_dataclass_defaults():
    parsed = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert parsed == SpeculativeConfig("ngram", 3)
    assert parsed.prompt_lookup_min == 2


def test_a_draft_needs_only_its_model():
    """What a new user writes first: k is the policy's deepest, 4 for a draft."""
    assert SpeculativeConfig.parse('{"method": "draft", "model": "small.gguf"}') == SpeculativeConfig(
        "draft", 4, model="small.gguf"
    )
    assert SpeculativeConfig.parse('{"method": "ngram"}').num_speculative_tokens == 7


def test_ngram_lookup_finds_the_latest_longest_match():
    proposer = NgramProposer(SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3))
    assert proposer.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]
    assert proposer.lookup([5, 6, 7], 2) == []
    assert proposer.lookup([4, 4], 2) == [4]


def test_ngram_lookup_agrees_with_its_definition_on_random_contexts():
    def defined(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
        for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
            for end in range(len(tokens) - 2, n - 2, -1):  # the latest earlier occurrence first
                if tokens[end - n + 1 : end + 1] == tokens[-n:]:
                    return tokens[end + 1 : end + 1 + k]
        return []

    rng = np.random.default_rng(0)
    for _ in range(2000):
        min_n = int(rng.integers(1, 4))
        max_n = int(rng.integers(min_n, 6))
        tokens = rng.integers(0, int(rng.integers(1, 6)), size=int(rng.integers(1, 40))).tolist()
        config = SpeculativeConfig("ngram", 4, prompt_lookup_min=min_n, prompt_lookup_max=max_n)
        assert NgramProposer(config).lookup(tokens, 4) == defined(tokens, 4, min_n, max_n), tokens


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
        llm = verifying_everything(
            LLM(str(folder), num_kv_blocks=2048, max_num_seqs=64, speculative_config=spec)
        )
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
    verifying_everything(llm)
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


def trimmed(seqs: list[Sequence], acceptance: ForcedAcceptance, cost: StepCost | None = None) -> None:
    offers = [forced_offer(s, acceptance) for s in seqs]
    plan(offers, len(seqs), cost or StepCost())
    for offer in offers:
        settle(offer)


def test_forced_proposals_are_kept_where_rows_are_cheap_and_cut_where_the_batch_is_arithmetic_bound():
    [alone] = forced_seqs(1, 6)
    trimmed([alone], measured_acceptance())
    assert alone.spec_token_ids == list(range(10, 16)) and alone.spec_num_forced == 6
    batch = forced_seqs(8, 6)
    trimmed(batch, measured_acceptance())
    assert [len(s.spec_token_ids) for s in batch] == [2] * 8  # the positions accepted 80 % and more
    assert all(s.spec_num_forced == 2 and s.spec_token_ids == [10, 11] for s in batch)
    fresh = forced_seqs(8, 6)
    trimmed(fresh, ForcedAcceptance())  # nothing verified yet: proposals are taken as accepted
    assert all(len(s.spec_token_ids) == 6 for s in fresh)


# ---- how many proposed tokens a step verifies ---------------------------------------------------------


def decoding_seq(name: str = "r0") -> Sequence:
    seq = Sequence(name, [1, 2, 3], SamplingParams(max_tokens=64), seed=0)
    seq.num_computed_tokens = len(seq) - 1
    return seq


def measured(seconds_by_rows: dict[int, float], draft_seconds: float = 0.0) -> StepCost:
    return StepCost(dict(seconds_by_rows), draft_seconds)


# Qwen2.5-Coder-1.5B Q4_K_M here: a one-row step reads the weights (37 ms); each more row adds ~8 ms of
# int8 arithmetic; a step of the 0.5B draft takes ~13 ms.
QWEN_15B = {1: 0.037, 2: 0.045, 5: 0.070, 8: 0.095}


def planned(offers, decoding_rows: int, cost: StepCost) -> list[int]:
    plan(offers, decoding_rows, cost)
    return [o.taken for o in offers]


def test_the_plan_takes_free_proposals_deep_and_weighs_drafted_ones_against_the_draft_steps():
    engine_rate = ProposalAcceptance(passed=8, tested=10)  # 80 % accepted after the one before
    lookup = proposer_offer(decoding_seq(), 7, engine_rate, drafted=False)
    assert planned([lookup], 1, measured(QWEN_15B)) == [4]  # 0.8, 0.64, 0.51, 0.41 each beat ~0.2 a row
    drafted = proposer_offer(decoding_seq(), 4, engine_rate, drafted=True)
    # The second position's 0.64 tokens would cost a row and a draft step: 30.8 against 31.0 tokens/s.
    assert planned([drafted], 1, measured(QWEN_15B, draft_seconds=0.013)) == [1]
    poor = proposer_offer(decoding_seq(), 4, ProposalAcceptance(passed=3, tested=10), drafted=True)
    assert planned([poor], 1, measured(QWEN_15B, draft_seconds=0.013)) == [0]
    batch = [proposer_offer(decoding_seq(f"r{i}"), 7, engine_rate, drafted=False) for i in range(8)]
    assert planned(batch, 8, measured(QWEN_15B)) == [1] * 8  # 8 rows: arithmetic-bound, only the likeliest


def test_a_sequence_whose_lookups_fail_probes_ever_more_rarely_and_resumes_when_they_pay():
    seq, engine_rate, cost = decoding_seq(), ProposalAcceptance(), measured(QWEN_15B)
    verified = []
    for step in range(2000):
        if room := proposal_room(seq, 4, 4096):
            offer = proposer_offer(seq, room, engine_rate, drafted=False)
            plan([offer], 1, cost)
            if taken := settle(offer):
                verified.append(step)
                record_acceptance(seq, taken, 0)
                engine_rate.record(taken, 0)
    gaps = np.diff(verified)
    assert len(verified) < 20 and list(gaps) == sorted(gaps) and gaps[-1] >= 128, verified
    for _ in range(3):  # its text turns repetitive: probes are accepted, and it proposes every step again
        while not (room := proposal_room(seq, 4, 4096)):
            pass
        offer = proposer_offer(seq, room, engine_rate, drafted=False)
        plan([offer], 1, cost)
        record_acceptance(seq, settle(offer), 1)
    assert seq.spec_skip == 0 and not seq.spec_probe_due


def test_a_due_probe_is_verified_where_a_row_is_cheap_and_not_where_it_costs_what_it_may_save():
    """Measured on the 1.5B (benchmarks/step_rows.py): a fifth row costs 61.6 ms against 49.4, about
    what a sure proposal saves; probing there cost code answers at 4 streams ~2 % against none."""
    cost = measured({1: 0.0339, 2: 0.0352, 4: 0.0494, 5: 0.0616})
    never_accepted = ProposalAcceptance(passed=0, tested=100)
    for rows, taken in ((1, 1), (4, 0)):
        seqs = [decoding_seq(f"r{i}") for i in range(rows)]
        seqs[0].spec_probe_due = True
        offers = [proposer_offer(s, 4, never_accepted, drafted=False) for s in seqs]
        assert planned(offers, rows, cost) == [taken] + [0] * (rows - 1)
        settle(offers[0])
        assert (seqs[0].spec_skip > 0, seqs[0].spec_probe_due) == ((False, False) if taken else (True, True))


def test_a_draft_that_does_not_pay_stops_for_the_rest_of_the_request():
    """Resuming would cost the draft a prefill of every token since: no probes."""
    seq = decoding_seq()
    offer = proposer_offer(seq, 4, ProposalAcceptance(passed=3, tested=10), drafted=True)
    plan([offer], 1, measured(QWEN_15B, draft_seconds=0.013))
    assert settle(offer) == 0
    assert sum(proposal_room(seq, 4, 4096) > 0 for _ in range(seq.params.max_tokens)) == 0


def test_a_draft_starts_only_where_the_answer_left_earns_its_catch_up_back_twice():
    """Drafting at 80 % saves ~4.8 ms a token on the 1.5B: the 0.5B's prefill of a 160-token prompt
    (~0.4 s) is earned back twice over a 200-token answer, not over a 160-token one (1.9 times)."""
    cost = measured(QWEN_15B, draft_seconds=0.013)
    assert not catch_up_pays(0.8, 4, 160, 160 * 0.0025, cost)
    assert catch_up_pays(0.8, 4, 200, 160 * 0.0025, cost)
    assert not catch_up_pays(0.3, 4, 10_000, 0.0, cost)  # a draft that fails costs more than it saves


def drafting_at_measured_costs(model_dir, tiny_draft) -> LLM:
    """The tiny draft's engine with the 1.5B's costs kept as measured, an engine-wide acceptance at which
    the plan alone would draft, and the 0.5B's catch-up seconds a token."""
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(tiny_draft), "num_speculative_tokens": 3},
    )
    speculator, proposer = llm.engine.speculator, llm.engine.proposer
    speculator.cost = measured(QWEN_15B, draft_seconds=0.013)
    speculator.cost.record_step = speculator.cost.record_draft = lambda *args: None  # kept as measured
    speculator.proposal_acceptance = ProposalAcceptance(passed=8, tested=10)
    proposer.catch_up_seconds = 0.0025
    return llm


def test_a_draft_behind_on_a_short_answer_never_drafts_and_gives_its_blocks_back(model_dir, tiny_draft):
    llm = drafting_at_measured_costs(model_dir, tiny_draft)
    proposer = llm.engine.proposer
    long_prompt = " ".join(PROMPTS) * 2
    llm.generate(long_prompt, greedy(8))
    assert llm.engine.stats().spec_drafts == 0
    assert not proposer.states and proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_each_request_turned_down_raises_the_next_ones_bet_until_one_drafts_as_a_probe(model_dir, tiny_draft):
    """Only a drafted request's verifications move the rate: without the raise, a draft turned down for
    the text it failed on would never draft again, whatever the text turned to. At these costs a
    256-token answer 200 tokens behind pays from ~76 %: from 58 %, the third request (78 %) probes."""
    llm = drafting_at_measured_costs(model_dir, tiny_draft)
    speculator = llm.engine.speculator
    speculator.request_acceptance.rate = 0.58
    decisions = []
    for i in range(6):
        seq = Sequence(f"r{i}", [1000 + i] + list(range(2000, 2200)), greedy(256), 0)
        decisions.append(speculator._catch_up_pays(seq, 3))
        if decisions[-1]:
            assert seq.spec_passed == seq.spec_tested == PRIOR_POSITIONS, "a probe starts as if accepted"
    assert decisions == [False, False, True, False, False, True]


def test_a_drafted_request_moves_the_requests_acceptance_halfway_whatever_its_length():
    """A chat request that stopped drafting after 4 positions weighs as much as a code answer's 200."""
    acceptance = RequestAcceptance()
    code, chat, never = (Sequence(name, [1], greedy(8), 0) for name in ("code", "chat", "never"))
    code.spec_passed_total, code.spec_tested_total = 180, 200
    chat.spec_passed_total, chat.spec_tested_total = 1, 4
    acceptance.record(code)
    acceptance.record(never)  # never verified: no vote
    assert acceptance.rate == pytest.approx(0.9)
    acceptance.record(chat)
    assert acceptance.rate == pytest.approx((0.9 + 0.25) / 2)


def test_a_drafted_requests_acceptance_is_recorded_when_it_ends(model_dir, tiny_draft):
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(tiny_draft), "num_speculative_tokens": 3},
    )
    llm.generate(PROMPTS[0], greedy(24))
    assert llm.engine.stats().spec_drafts > 0
    assert llm.engine.speculator.request_acceptance.rate is not None
    assert not llm.engine.proposer.states


def test_a_draft_that_stops_paying_gives_its_blocks_back_while_its_request_runs(model_dir, tiny_draft):
    llm = LLM(
        str(model_dir),
        num_kv_blocks=256,
        speculative_config={"method": "draft", "model": str(tiny_draft), "num_speculative_tokens": 3},
    )
    engine = llm.engine
    speculator, proposer = engine.speculator, engine.proposer
    speculator.cost = measured(QWEN_15B, draft_seconds=0.013)
    speculator.cost.record_step = speculator.cost.record_draft = lambda *args: None  # kept as measured
    speculator.proposal_acceptance = ProposalAcceptance(passed=8, tested=10)
    engine.add_request(llm.tokenizer.encode(PROMPTS[0]), greedy(32))
    while not engine.stats().spec_drafts:
        engine.step()
    assert proposer.states, "it drafted, so the draft holds the request's KV"
    [seq] = engine.scheduler.running
    speculator.proposal_acceptance = ProposalAcceptance(passed=1, tested=100)
    seq.spec_passed, seq.spec_tested = 0.0, 100.0  # its proposals stop paying
    engine.step()
    engine.step()
    assert engine.has_unfinished_requests() and seq.spec_skip > 0
    assert not proposer.states and proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_the_draft_takes_an_agent_turns_history_from_its_own_prefix_cache(model_dir, hf_greedy, tiny_draft):
    """The next turn replays the last one: the draft prefills only what is new."""
    llm = verifying_everything(
        LLM(
            str(model_dir),
            num_kv_blocks=256,
            speculative_config={"method": "draft", "model": str(tiny_draft), "num_speculative_tokens": 2},
        )
    )
    proposer = llm.engine.proposer
    run = proposer.runner.run
    computed: list[int] = []

    def counting(batch, *args):
        computed.append(sum(batch.num_new_tokens))
        return run(batch, *args)

    proposer.runner.run = counting
    history = llm.tokenizer.encode(" ".join(PROMPTS))
    first = llm.generate([history], greedy(8))[0].token_ids
    first_turn = sum(computed)
    computed.clear()
    next_turn = history + first + llm.tokenizer.encode(" And then?")
    assert llm.generate([next_turn], greedy(8))[0].token_ids == hf_greedy(tuple(next_turn), 8)
    assert first_turn > len(history) and sum(computed) < len(next_turn) - len(history) + 8 + 2 * 8


def test_measured_step_costs_interpolate_and_extrapolate_along_their_line():
    cost = measured({1: 0.037, 5: 0.070})
    assert cost.seconds(3) == pytest.approx(0.0535)
    assert cost.seconds(9) == pytest.approx(0.070 + 4 * 0.00825)
    assert measured({1: 0.037}).seconds(2) == pytest.approx(0.037 * 5.7 / 4.7)  # the prior's shape
    cost.record_step(1, 0.047)
    pace = 0.8 + 0.2 * 0.047 / 0.037  # a fifth of the way to the measurement's ratio to its prediction
    assert cost.pace == pytest.approx(pace)
    assert cost.seconds(1) == pytest.approx(pace * (0.95 * 0.037 + 0.05 * 0.047 / pace))  # its own, slowly
    assert cost.seconds(5) == pytest.approx(pace * 0.070)  # a row count not measured again follows


def test_a_row_count_the_plan_stopped_taking_follows_the_machines_pace():
    """Two-row steps measured in a slow minute, then only one-row steps at the machine's usual speed: the
    two-row cost falls with them, and a draft accepted 80 % of the time pays again."""
    cost = measured({1: 0.046, 2: 0.051}, draft_seconds=0.012)
    engine_rate = ProposalAcceptance(passed=8, tested=10)
    for _ in range(20):
        cost.record_step(1, 0.029)
    assert cost.seconds(2) == pytest.approx(0.051 * 0.029 / 0.046, rel=0.1)
    [taken] = planned([proposer_offer(decoding_seq(), 4, engine_rate, drafted=True)], 1, cost)
    assert taken >= 1
    kept_apart = measured({1: 0.029, 2: 0.051}, draft_seconds=0.012)
    assert planned([proposer_offer(decoding_seq(), 4, engine_rate, drafted=True)], 1, kept_apart) == [0]


def test_auto_is_prompt_lookup_as_deep_as_a_decode_verification(model_dir, hf_greedy):
    assert SpeculativeConfig.parse("auto") == SpeculativeConfig("ngram", 7, 2, 4, greedy_only=True)
    assert SpeculativeConfig.parse("off") is None
    llm = LLM(str(model_dir), num_kv_blocks=256, speculative_config="auto")
    check_equal(llm, hf_greedy, REPETITIVE[:2], 32)
    stats = llm.engine.stats()
    assert stats.spec_accepted_tokens > 0  # the 135M's steps are overhead-bound: proposals pay
