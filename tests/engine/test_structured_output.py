"""Structured outputs in the engine: the grammar's mask on each logits row, termination, masks through
speculative proposals (rolled back after), and forced tokens proposed, accepted and changing nothing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from llmopt.engine.llm import LLM
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.spec_decode.proposal import Proposal
from llmopt.engine.structured.bitmask import BatchMask, apply_token_bitmask
from llmopt.engine.structured.request import StructuredOutput
from llmopt.engine.structured.sequence_grammar import SequenceGrammar
from tests.engine.free_rows import verifying_everything

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}
UNRESOLVED = json.dumps({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
ASK = "Describe a person who lives in a big city, as JSON with a name, an age, a city and tags."


def params(output: StructuredOutput, max_tokens: int = 96, **kw) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=kw.pop("temperature", 0), structured_output=output, **kw
    )


def run(engine: LLMEngine, prompt: list[int], p: SamplingParams) -> tuple[list[int], str, int]:
    """One request alone: its tokens, finish reason and how many engine steps it took."""
    request_id = engine.add_request(prompt, p)
    tokens, reason, steps = [], None, 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            assert out.request_id == request_id and out.error is None, out.error
            tokens += out.new_token_ids
            reason = out.finish_reason if out.finished else reason
    return tokens, reason, steps


def grammar_of(llm: LLM, output: StructuredOutput) -> SequenceGrammar:
    engine = llm.engine
    return SequenceGrammar(engine.grammars.compile(output), engine.runner.model.config.vocab_size)


def allowed(grammar: SequenceGrammar, vocab: int, proposals: list[int]) -> list[set[int]]:
    logits = torch.zeros(len(proposals) + 1, vocab)
    masks = BatchMask(len(proposals) + 1, vocab)  # the engine's path: fill the rows, apply once
    masks.fill(grammar, slice(0, len(proposals) + 1), proposals)
    masks.apply(logits)
    return [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]


@pytest.fixture(scope="module")
def spec_llm(model_dir) -> LLM:
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    return verifying_everything(LLM(str(model_dir), num_kv_blocks=256, speculative_config=spec))


def test_the_mask_allows_only_what_the_grammar_allows_and_leaves_the_matcher_where_it_was(llm):
    tok, vocab = llm.tokenizer, llm.engine.runner.model.config.vocab_size
    grammar = grammar_of(llm, StructuredOutput.choice(["yes", "no"]))
    [first] = allowed(grammar, vocab, [])
    texts = {tok.decode([t]) for t in first}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts), texts
    assert not first & grammar.stop_token_ids  # nothing is complete yet
    yes, no = tok.encode("yes", add_special_tokens=False), tok.encode("no", add_special_tokens=False)
    # Through the proposals: after "yes" only a stop token; a proposal the grammar refuses ("no" after
    # "yes") is rejected by its own row, and the rows after it repeat that row.
    rows = allowed(grammar, vocab, yes + no)
    assert rows[0] == first and rows[len(yes)] == grammar.stop_token_ids
    assert all(row == grammar.stop_token_ids for row in rows[len(yes) :])
    assert allowed(grammar, vocab, []) == [first], "the matcher was rolled back after the proposals"
    assert grammar.valid_prefix(yes + no) == len(yes)
    grammar.accept(yes)
    assert grammar.forced_tokens(4) == [] and not grammar.terminated
    grammar.accept([min(grammar.stop_token_ids)])
    assert grammar.terminated


def test_the_bitmask_bans_exactly_what_xgrammars_own_kernel_bans():
    vocab = 1000  # not a multiple of 32: the last word is partly padding
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 32), dtype=torch.int32, generator=generator)
    bitmask[1] = -1  # everything allowed
    bitmask[2] = 0
    bitmask[2, 3] = 1 << 5  # one token allowed: 3 * 32 + 5
    logits = torch.randn(4, vocab, generator=generator)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, vocab_size=vocab)
    apply_token_bitmask(logits, bitmask)
    assert torch.equal(logits, expected)
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [3 * 32 + 5]


def test_a_steps_mask_gives_each_grammar_row_its_own_state_and_leaves_other_rows_alone(llm):
    """Rows 0, 2-4 follow two grammars (the second through two proposals); rows 1 and 5 are free text."""
    tok, vocab = llm.tokenizer, llm.engine.runner.model.config.vocab_size
    choice = grammar_of(llm, StructuredOutput.choice(["yes", "no"]))
    person = grammar_of(llm, StructuredOutput.json_schema(PERSON))
    proposals = tok.encode('{"name', add_special_tokens=False)[:2]
    expected = allowed(choice, vocab, []) + allowed(person, vocab, proposals)
    masks = BatchMask(4, vocab)
    masks.fill(choice, slice(0, 1), [])
    masks.fill(person, slice(2, 2 + len(proposals) + 1), proposals)
    logits = torch.zeros(6, vocab)
    masks.apply(logits)
    rows = [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]
    assert [rows[0], *rows[2:5]] == expected and rows[1] == rows[5] == set(range(vocab))
    assert allowed(person, vocab, []) == expected[1:2], "the matcher was rolled back after the proposals"


def test_batched_greedy_outputs_equal_one_at_a_time_with_grammars_and_free_text_mixed(llm):
    """The step masks every grammar row at once and picks every row in one call: each request of a
    mixed batch (a schema with forced tokens off and on, a choice, free text) gets the tokens it gets
    alone."""
    schema = StructuredOutput.json_schema(PERSON)
    requests = [
        (llm.chat_prompt(ASK), params(schema, max_tokens=24, forced_tokens=False)),
        (llm.chat_prompt(f"{ASK} Someone from Tokyo."), params(schema, max_tokens=24)),
        (llm.chat_prompt("Is the sky blue?"), params(StructuredOutput.choice(["yes", "no"]))),
        (llm.chat_prompt("Name a colour."), SamplingParams(max_tokens=12, temperature=0)),
    ]
    alone = [run(llm.engine, prompt, p)[0] for prompt, p in requests]
    together = llm.generate([prompt for prompt, _ in requests], [p for _, p in requests])
    assert [out.token_ids for out in together] == alone


def test_greedy_output_follows_the_schema_and_stops(llm):
    prompt = llm.chat_prompt(ASK)
    tokens, reason, _ = run(llm.engine, prompt, params(StructuredOutput.json_schema(PERSON)))
    jsonschema.validate(json.loads(llm.tokenizer.decode(tokens, skip_special_tokens=True)), PERSON)
    assert reason == "stop" and tokens[-1] in llm.engine.eos_token_ids


def test_sampled_outputs_follow_the_schema(llm):
    prompt = llm.chat_prompt(ASK)
    ps = [params(StructuredOutput.json_schema(PERSON), temperature=1.0, seed=s) for s in range(3)]
    outs = llm.generate([prompt] * 3, ps)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)
    assert len({o.text for o in outs}) > 1, "sampling still samples"


@pytest.mark.parametrize(
    "output, check",
    [
        (StructuredOutput("regex", r"[0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        (StructuredOutput.choice(["red", "green", "blue"]), lambda t: t in ("red", "green", "blue")),
        (
            StructuredOutput("grammar", 'root ::= "It is " ("hot" | "cold") "."'),
            lambda t: t in ("It is hot.", "It is cold."),
        ),
    ],
)
def test_regex_choice_and_grammar_end_where_the_grammar_does_even_with_ignore_eos(llm, output, check):
    prompt = llm.chat_prompt("Answer in a few words: what is the weather like?")
    [out] = llm.generate([prompt], params(output, max_tokens=32, ignore_eos=True))
    assert out.finish_reason == "stop" and check(out.text), out.text


def test_forced_tokens_are_proposed_accepted_and_change_nothing(llm):
    engine, prompt = llm.engine, llm.chat_prompt(ASK)
    output = StructuredOutput.json_schema(PERSON)
    off, _, steps_off = run(engine, prompt, params(output, forced_tokens=False))
    before = engine.stats()
    on, _, steps_on = run(engine, prompt, params(output))
    after = engine.stats()
    assert on == off
    forced = after.spec_forced_tokens - before.spec_forced_tokens
    # Every key and punctuation mark is forced: at least the 4 keys' tokens, computed in fewer steps.
    assert forced >= 8 and steps_on <= steps_off - forced // 2, (forced, steps_on, steps_off)
    assert after.spec_accepted_tokens - before.spec_accepted_tokens >= forced
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)


def test_n_gram_proposals_past_forced_tokens_change_nothing(llm, spec_llm):
    """With n-gram speculation (forced tokens on and off) the greedy output equals the engine's without
    speculation; lookups the schema refuses (the example's "zip") are cut before they are verified."""
    example = json.dumps({"name": "Ann", "age": 30, "city": "Paris", "tags": ["a", "b"], "zip": 75001})
    prompt = llm.chat_prompt(f"{ASK} Like this one: {example} or this one: {example}")
    output = StructuredOutput.json_schema(PERSON)
    reference, _, _ = run(llm.engine, prompt, params(output, forced_tokens=False))
    for forced in (False, True):
        before = spec_llm.engine.stats()
        tokens, reason, _ = run(spec_llm.engine, prompt, params(output, forced_tokens=forced))
        assert tokens == reference and reason == "stop"
        assert spec_llm.engine.stats().spec_drafts > before.spec_drafts


def test_rejected_proposals_roll_the_grammar_back(llm, spec_llm, monkeypatch):
    """Proposals the grammar allows but the model does not pick ("a" inside the name string) are
    verified and rejected; the matcher rolls back, so the output equals the one without speculation."""
    a = llm.tokenizer.encode("a", add_special_tokens=False)
    engine = spec_llm.engine
    monkeypatch.setattr(engine.proposer, "propose", lambda seqs, ks: [Proposal(a * k) for k in ks])
    prompt = llm.chat_prompt(ASK)
    output = StructuredOutput.json_schema(PERSON)
    reference, _, _ = run(llm.engine, prompt, params(output, forced_tokens=False))
    for forced in (False, True):
        before = engine.stats()
        tokens, reason, _ = run(engine, prompt, params(output, forced_tokens=forced))
        after = engine.stats()
        assert tokens == reference and reason == "stop"
        proposed = after.spec_draft_tokens - before.spec_draft_tokens
        assert proposed > after.spec_accepted_tokens - before.spec_accepted_tokens >= 0, (proposed, after)


def test_min_tokens_with_a_structured_output_is_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=2, structured_output=StructuredOutput("json_object"))


def test_what_xgrammar_cannot_compile_is_a_value_error_naming_the_kind(llm):
    for output in (StructuredOutput("regex", "(unclosed"), StructuredOutput("grammar", "root ::= (")):
        with pytest.raises(ValueError, match=output.kind):
            llm.engine.grammars.compile(output)
    with pytest.raises(ValueError, match="json_schema"):
        llm.engine.add_request("hi", params(StructuredOutput("json_schema", UNRESOLVED)))
