"""The engine against transformers' own greedy decode of the same model, token for token."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmopt.engine.llm import LLM
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0)


def drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def assert_all_blocks_free(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


@pytest.fixture(scope="module")
def small_llm(model_dir) -> LLM:
    """A KV pool of 12 blocks x 16 tokens and a 64-token step budget: preemption and chunked prefill."""
    return LLM(str(model_dir), num_kv_blocks=12, max_num_batched_tokens=64)


def test_batched_greedy_equals_transformers(llm, hf_greedy):
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    lengths = [8 + 5 * i for i in range(len(PROMPTS))]
    outputs = llm.generate(ids, [greedy(n) for n in lengths])
    for prompt_ids, n, out in zip(ids, lengths, outputs):
        assert out.token_ids == hf_greedy(tuple(prompt_ids), n)
    assert_all_blocks_free(llm.engine)


def test_pytorch_fallback_equals_transformers(model_dir, hf_greedy, monkeypatch):
    """The path where the compiled kernels cannot be built (and for bf16): MKL GEMMs on plain [in, out]
    weights, gather + SDPA attention, PyTorch's element-wise ops."""
    monkeypatch.setattr("llmopt.engine.model_runner.kernels.load", lambda: False)
    fallback = LLM(str(model_dir), num_kv_blocks=64)
    assert not fallback.engine.runner.use_kernels
    assert fallback.engine.runner.model.layers[0].qkv_weight.dim() == 2
    ids = [fallback.tokenizer.encode(p) for p in PROMPTS[:4]]
    outputs = fallback.generate(ids, greedy(16))
    for prompt_ids, out in zip(ids, outputs):
        assert out.token_ids == hf_greedy(tuple(prompt_ids), 16)


def test_sequences_joining_mid_flight(llm, hf_greedy):
    engine = llm.engine
    ids = [llm.tokenizer.encode(p) for p in PROMPTS[:6]]
    first = [engine.add_request(p, greedy(24)) for p in ids[:3]]
    tokens: dict[str, list[int]] = {}
    for _ in range(5):
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    later = [engine.add_request(p, greedy(24)) for p in ids[3:]]
    for rid, toks in drain(engine).items():
        tokens.setdefault(rid, []).extend(toks)
    for rid, prompt_ids in zip(first + later, ids):
        assert tokens[rid] == hf_greedy(tuple(prompt_ids), 24)
    assert_all_blocks_free(engine)


def test_preemption_keeps_outputs_exact(small_llm, hf_greedy):
    engine = small_llm.engine
    before = engine.scheduler.num_preemptions
    ids = [small_llm.tokenizer.encode(p) for p in PROMPTS[:8]]
    outputs = small_llm.generate(ids, greedy(40))
    assert engine.scheduler.num_preemptions > before, "the pool is small enough that preemption must happen"
    for prompt_ids, out in zip(ids, outputs):
        assert out.token_ids == hf_greedy(tuple(prompt_ids), 40)
    assert_all_blocks_free(engine)


def test_chunked_prefill_of_a_prompt_longer_than_the_budget(small_llm, hf_greedy):
    prompt = " ".join(PROMPTS) + " Summarize the text above."
    ids = small_llm.tokenizer.encode(prompt)
    assert len(ids) > 2 * small_llm.engine.config.max_num_batched_tokens
    short = small_llm.tokenizer.encode(PROMPTS[0])
    long_out, short_out = small_llm.generate([ids, short], greedy(16))
    assert long_out.token_ids == hf_greedy(tuple(ids), 16)
    assert short_out.token_ids == hf_greedy(tuple(short), 16)
    assert_all_blocks_free(small_llm.engine)


def test_prefix_cache_hits_are_reported_and_exact(llm, hf_greedy):
    shared = " ".join(PROMPTS[:6])
    first = llm.tokenizer.encode(shared + " First question: what is it about?")
    second = llm.tokenizer.encode(shared + " Second question: who wrote it?")
    [a] = llm.generate([first], greedy(12))
    bm = llm.engine.block_manager
    hits_before = bm.prefix_cache_hits
    [b] = llm.generate([second], greedy(12))
    common = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert b.cached_tokens == common // 16 * 16 > 0
    assert bm.prefix_cache_hits - hits_before == b.cached_tokens
    assert a.token_ids == hf_greedy(tuple(first), 12)
    assert b.token_ids == hf_greedy(tuple(second), 12)
    assert_all_blocks_free(llm.engine)


def test_warm_up_leaves_nothing_behind(model_dir, llm, hf_greedy, monkeypatch):
    """`LLM()` warms its engine up, as the server does; the start-up forward writes blocks 0.. but caches
    nothing: a prompt of its own tokens finds no prefix hit and decodes as transformers does. An engine
    whose cache holds prefixes refuses it."""
    warm_ups = []
    real_warm_up = LLMEngine.warm_up
    monkeypatch.setattr(LLMEngine, "warm_up", lambda engine: warm_ups.append(real_warm_up(engine)))
    fresh = LLM(str(model_dir), num_kv_blocks=64)
    assert len(warm_ups) == 1
    assert_all_blocks_free(fresh.engine)
    prompt = [0] * 40  # the warm-up's tokens
    [out] = fresh.generate([prompt], greedy(8))
    assert out.cached_tokens == 0
    assert out.token_ids == hf_greedy(tuple(prompt), 8)
    llm.generate([llm.tokenizer.encode(" ".join(PROMPTS))], greedy(1))  # the shared engine caches it
    with pytest.raises(AssertionError, match="prefix cache"):
        llm.engine.warm_up()


def test_identical_prompts_in_one_batch(llm, hf_greedy):
    ids = llm.tokenizer.encode(" ".join(PROMPTS[:4]))
    outputs = llm.generate([ids] * 4, greedy(10))
    expected = hf_greedy(tuple(ids), 10)
    assert all(o.token_ids == expected for o in outputs)


def test_requests_sharing_a_prefix_being_computed_equal_transformers(llm, hf_greedy, monkeypatch):
    """Four requests arrive together with one 145-token prefix, prefilled in chunks of 64: the first
    computes it, the other three wait for its blocks (in-flight sharing) and take 144 tokens from them."""
    engine = llm.engine
    monkeypatch.setattr(engine.scheduler, "max_num_batched_tokens", 64)
    engine.reset_prefix_cache()  # nothing left from earlier tests: the prefix is computed here
    shared = llm.tokenizer.encode(
        "You are a careful assistant. Read these notes first.\n" + "\n".join(PROMPTS)
    )
    questions = [" Which note mentions France?", " Which one is code?", " Count the notes.", " Name a fruit."]
    ids = [shared + llm.tokenizer.encode(q) for q in questions]
    outputs = llm.generate(ids, greedy(8))
    assert [o.cached_tokens for o in outputs] == [0] + [len(shared) // 16 * 16] * 3
    for prompt_ids, out in zip(ids, outputs):
        assert out.token_ids == hf_greedy(tuple(prompt_ids), 8)
    assert_all_blocks_free(engine)
    assert not engine.block_manager.computing


def test_a_2048_token_budget_prefills_1500_tokens_in_one_step(llm, hf_greedy, monkeypatch):
    engine = llm.engine
    monkeypatch.setattr(engine.scheduler, "max_num_batched_tokens", 2048)
    engine.reset_prefix_cache()
    ids = llm.tokenizer.encode("\n".join(f"Note {i}: {p}" for i, p in enumerate(PROMPTS * 12)))[:1500]
    rid = engine.add_request(ids, greedy(4))
    [first] = engine.step()  # the whole prompt in one forward: the first token comes with it
    assert first.request_id == rid and len(first.new_token_ids) == 1
    tokens = first.new_token_ids + drain(engine)[rid]
    assert tokens == hf_greedy(tuple(ids), 4)
    assert_all_blocks_free(engine)


def test_abort_frees_blocks(llm):
    engine = llm.engine
    rid = engine.add_request(PROMPTS[2], greedy(200))
    other = engine.add_request(PROMPTS[3], greedy(200))
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    engine.abort_request(rid)
    engine.abort_request(other)
    finished = {o.request_id: o for o in engine.step() if o.finished}
    assert finished[rid].finish_reason == "abort" and finished[other].finish_reason == "abort"
    assert_all_blocks_free(engine)


def test_seeded_sampling_is_reproducible(llm):
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    a = llm.generate(PROMPTS[2], params)[0].token_ids
    # Same seed, different batch company: same tokens.
    batch = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[5]], [greedy(30), params, greedy(5)])
    assert batch[1].token_ids == a
    other = llm.generate(PROMPTS[2], SamplingParams(max_tokens=20, temperature=1.0, seed=4321))[0].token_ids
    assert other != a


def test_stop_string_cuts_text_exactly(llm):
    [full] = llm.generate("1, 2, 3, 4,", greedy(20))
    assert " 7," in full.text
    [cut] = llm.generate("1, 2, 3, 4,", SamplingParams(max_tokens=20, temperature=0, stop=[" 7,", "zzz"]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(" 7,")]


def test_stop_token_ids_and_max_tokens(llm):
    [full] = llm.generate("1, 2, 3, 4,", greedy(10))
    stop_at = full.token_ids[1]
    first = full.token_ids.index(stop_at)
    [out] = llm.generate(
        "1, 2, 3, 4,", SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop_at])
    )
    assert out.token_ids == full.token_ids[: first + 1] and out.finish_reason == "stop"
    assert full.finish_reason == "length" and len(full.token_ids) == 10


def test_streamed_deltas_never_split_characters(llm):
    engine = llm.engine
    prompt = "Écris une phrase en français avec des accents, puis en chinois: 你好世界。🙂"
    rid = engine.add_request(prompt, greedy(40))
    deltas, tokens = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid:
                deltas.append(out.new_text)
                tokens += out.new_token_ids
    assert all("\ufffd" not in d for d in deltas)
    expected = llm.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    # A character cut in half by max_tokens is dropped, never sent as U+FFFD.
    assert "".join(deltas) == expected.rstrip("\ufffd")


def test_request_longer_than_the_context_is_refused(llm):
    with pytest.raises(ValueError, match="maximum context length"):
        llm.engine.add_request([1] * 10, greedy(llm.engine.max_model_len))
    with pytest.raises(ValueError, match="empty"):
        llm.engine.add_request("", greedy(4))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_holds_back_eos(llm, temperature):
    prompt = llm.chat_prompt("Say hi.")
    [free] = llm.generate([prompt], SamplingParams(max_tokens=40, temperature=temperature, seed=2))
    assert free.finish_reason == "stop" and len(free.token_ids) < 30  # the model stops early on its own
    # The same seed: the free run stopped early, so only min_tokens can make this one run on.
    [held] = llm.generate(
        [prompt], SamplingParams(max_tokens=40, min_tokens=30, temperature=temperature, seed=2)
    )
    assert len(held.token_ids) >= 30
    if temperature == 0:  # greedy: the same tokens up to where the free run stopped
        assert held.token_ids[: len(free.token_ids) - 1] == free.token_ids[:-1]


@pytest.mark.slow  # several CLI processes, seconds each
def test_unseeded_requests_draw_the_same_seed_in_every_process():
    # str hash() is salted per process (PYTHONHASHSEED); a request's default seed must not be.
    code = "from llmopt.engine.llm_engine import request_seed; print(request_seed(0, 'req-7'))"
    seeds = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": salt},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for salt in ("1", "2")
    }
    assert len(seeds) == 1


def test_one_failing_request_ends_alone_and_the_batch_goes_on(llm, hf_greedy):
    engine = llm.engine
    vocab = engine.runner.model.config.vocab_size
    # Every token banned while min_tokens holds, and sampled: nothing can be drawn for this request.
    banned = list(range(vocab))
    impossible = SamplingParams(max_tokens=4, temperature=1.0, min_tokens=2, stop_token_ids=banned)
    ok_id = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=12, temperature=0))
    bad_id = engine.add_request(PROMPTS[1], impossible)
    finals, tokens = {}, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == ok_id:
                tokens += out.new_token_ids
            if out.finished:
                finals[out.request_id] = out
    assert finals[bad_id].finish_reason == "error" and "no token can be sampled" in finals[bad_id].error
    assert tokens == hf_greedy(tuple(engine.tokenize(PROMPTS[0])), 12)
    assert engine.block_manager.num_used_blocks == 0


def test_an_abort_that_lands_while_the_queues_drain_is_not_lost(llm):
    engine = llm.engine
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    drain_new = engine._drain_new
    request_id = None

    def drain_then_race() -> None:
        # Another thread adds a request and aborts it right after the new-request queue was emptied.
        nonlocal request_id
        drain_new()
        if request_id is None:
            request_id = engine.add_request("Once upon a time", params)
            engine.abort_request(request_id)

    engine._drain_new = drain_then_race
    try:
        finals = {}
        engine.step()
        for _ in range(5):
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
    finally:
        engine._drain_new = drain_new
    assert finals[request_id].finish_reason == "abort"
    assert not engine.has_unfinished_requests()


def test_a_callback_that_fails_on_the_last_output_ends_only_that_request(llm):
    engine = llm.engine

    def broken(output) -> None:
        if output.finished:
            raise RuntimeError("a client's callback broke")

    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=1, temperature=0), on_output=broken)
    other = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=3, temperature=0))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():  # must not raise: the failure belongs to one request
            if out.finished:
                finals[out.request_id] = out.finish_reason
    assert finals[other] == "length" and engine.block_manager.num_used_blocks == 0
