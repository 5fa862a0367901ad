"""Structured outputs' cost and forced tokens' gain, in one engine and one run: tok/s of free text
against a JSON schema of 10 fixed keys, with forced tokens off and on, at batch 1 and 8. Greedy. The
subjects take turns (a different one first each round) over --rounds rounds and the best round is kept
(the min-max shown). Every round gets prompts of its own (passages of corpus text no earlier prompt
used), the same for every subject of the round, with the prefix cache reset before each subject: all
answer the same prompts (forced tokens on and off give the same greedy answer) and none is served from
the cache. Writes results/structured_output.json.

    .venv/bin/python benchmarks/structured_output.py [--rounds 2] [--requests 2] [--passage-len 64]

Targets: the grammar's overhead per generated token (free text against the schema with forced tokens
off) at most 10 %; forced tokens on at least 1.3x the tok/s of forced tokens off. Free text runs with
ignore_eos to --free-tokens, about as long as the schema's answers, so both decode similar lengths, and
every subject gets the same prompt (asking for the schema's keys), so all prefill the same tokens: a
longer prompt for the schema alone cost it +14 % "per token" at batch 8, where prefill is half the time.
Besides tok/s end to end (prefill included), "decode tok/s" counts only the steps that prefilled no
prompt: the grammar's own cost per generated token.
"""

from __future__ import annotations

import argparse
import time

from harness import CorpusCursor, MachineLoad, rotated, spread
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.checkpoints import resolve_model
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.structured.request import StructuredOutput
from results import write_result

ENUMS = {
    "topic": ["programming", "data", "networks", "systems", "other"],
    "language": ["en", "fr", "de"],
    "audience": ["beginner", "intermediate", "expert"],
    "sentiment": ["positive", "neutral", "negative"],
}
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 32},
        "topic": {"type": "string", "enum": ENUMS["topic"]},
        "language": {"type": "string", "enum": ENUMS["language"]},
        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
        "has_code": {"type": "boolean"},
        "audience": {"type": "string", "enum": ENUMS["audience"]},
        "summary": {"type": "string", "maxLength": 64},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "sentiment": {"type": "string", "enum": ENUMS["sentiment"]},
        "reading_minutes": {"type": "integer", "minimum": 1, "maximum": 60},
    },
    "additionalProperties": False,
}
SCHEMA["required"] = list(SCHEMA["properties"])
SUBJECTS = ("free text", "json_schema, forced off", "json_schema, forced on")


def subject_params(subject: str, free_tokens: int) -> tuple[SamplingParams, str]:
    """The request settings of a subject, and what its prompt asks for."""
    keys = ", ".join(SCHEMA["properties"])
    ask = f"Describe it as a JSON object with the keys {keys}."
    if subject == "free text":
        return SamplingParams(max_tokens=free_tokens, temperature=0, ignore_eos=True), ask
    params = SamplingParams(
        max_tokens=4 * free_tokens,  # the schema bounds the answer: it ends well before this
        temperature=0,
        structured_output=StructuredOutput.json_schema(SCHEMA),
        forced_tokens=subject.endswith("on"),
    )
    return params, ask


def watch_prefills(engine: LLMEngine) -> list[bool]:
    """Whether each step from now on prefilled a prompt (a chunk of more tokens than a decode or a
    verification computes); undone by `del engine.scheduler.schedule`."""
    prefilled: list[bool] = []
    schedule = engine.scheduler.schedule

    def watched():
        batch = schedule()
        pairs = zip(batch.seqs, batch.num_new_tokens)
        prefilled.append(any(n > 1 + len(seq.spec_token_ids) for seq, n in pairs))
        return batch

    engine.scheduler.schedule = watched
    return prefilled


def run_point(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, batch: int) -> dict:
    engine.scheduler.max_num_seqs = batch
    before = engine.stats()
    prefilled = watch_prefills(engine)
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    tokens = dict.fromkeys(ids, 0)
    reasons: dict[str, str] = {}
    steps = 0
    decode_tokens, decode_seconds = 0, 0.0
    while engine.has_unfinished_requests():
        steps += 1
        step_start = time.perf_counter()
        outs = engine.step()
        step_seconds = time.perf_counter() - step_start
        for out in outs:
            assert out.error is None, out.error
            tokens[out.request_id] += len(out.new_token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        if not prefilled[-1]:
            decode_tokens += sum(len(out.new_token_ids) for out in outs)
            decode_seconds += step_seconds
    seconds = time.perf_counter() - start
    del engine.scheduler.schedule  # the instance attribute: the class's method again
    after = engine.stats()
    total = sum(tokens.values())
    return {
        "tokens": total,
        "seconds": seconds,
        "tok_s": total / seconds,
        "decode_tok_s": decode_tokens / decode_seconds if decode_seconds else 0.0,
        "steps": steps,
        "forced_tokens": after.spec_forced_tokens - before.spec_forced_tokens,
        "finish_reasons": sorted(reasons.values()),
    }


def round_prompts(engine: LLMEngine, cursor: CorpusCursor, count: int, passage_len: int) -> list[list[int]]:
    """A round's prompts, every subject's: fresh corpus passages, each asking for the schema's keys."""
    _, ask = subject_params(SUBJECTS[0], 1)
    prompts = []
    for _ in range(count):
        passage = engine.tokenizer.decode(cursor.take(passage_len), skip_special_tokens=True)
        message = f"Here is a passage:\n\n{passage}\n\n{ask}"
        prompts.append(engine.chat_token_ids([{"role": "user", "content": message}]))
    return prompts


def measure(engine: LLMEngine, cursor: CorpusCursor, args, console: Console) -> dict[str, dict]:
    results: dict[str, dict] = {}
    rounds: dict[str, list[float]] = {}
    for batch in (1, 8):
        count = args.requests * batch
        for round_index in range(args.rounds):
            prompts = round_prompts(engine, cursor, count, args.passage_len)
            for subject in rotated(list(SUBJECTS), round_index):
                params, _ = subject_params(subject, args.free_tokens)
                engine.reset_prefix_cache()  # the same prompts for every subject, none served from cache
                point = run_point(engine, prompts, params, batch)
                key = f"{subject}|{batch}"
                rounds.setdefault(key, []).append(point["tok_s"])
                console.print(
                    f"batch {batch}, round {round_index + 1}, {subject}: {point['tok_s']:.1f} tok/s"
                )
                if key not in results or point["tok_s"] > results[key]["tok_s"]:
                    results[key] = {"subject": subject, "batch": batch, **point}
        for subject in SUBJECTS:
            results[f"{subject}|{batch}"]["rounds_tok_s"] = rounds[f"{subject}|{batch}"]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="rounds in which the subjects take turns")
    ap.add_argument("--requests", type=int, default=2, help="requests per point, times the batch")
    ap.add_argument("--passage-len", type=int, default=64, help="corpus tokens in each prompt")
    ap.add_argument("--free-tokens", type=int, default=96, help="free text's output length")
    args = ap.parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    engine = LLMEngine(EngineConfig(model=str(resolve_model()), num_kv_blocks=512))
    cursor = CorpusCursor(engine.tokenizer)
    engine.grammars.compile(StructuredOutput.json_schema(SCHEMA))  # compiled once, as a server's cache does
    for subject in SUBJECTS:  # warm-up, on text no point reuses
        params, _ = subject_params(subject, 8)
        run_point(engine, [cursor.take(32)], params, 1)
    results = measure(engine, cursor, args, console)

    table = Table(
        title=load.title(
            f"structured outputs, greedy, one engine; best of {args.rounds} rounds (subjects take turns), "
            f"{args.requests} x batch requests per point, fresh prompts"
        )
    )
    for col in (
        "batch",
        "subject",
        "tok/s",
        "rounds",
        "decode tok/s",
        "tokens",
        "steps",
        "forced",
        "vs free text",
        "vs forced off",
    ):
        table.add_column(col, justify="right")
    for batch in (1, 8):
        free = results[f"free text|{batch}"]["tok_s"]
        off = results[f"json_schema, forced off|{batch}"]["tok_s"]
        for subject in SUBJECTS:
            r = results[f"{subject}|{batch}"]
            r["vs_free_text"], r["vs_forced_off"] = r["tok_s"] / free, r["tok_s"] / off
            table.add_row(
                str(batch),
                subject,
                f"{r['tok_s']:.1f}",
                spread(r["rounds_tok_s"]),
                f"{r['decode_tok_s']:.1f}",
                str(r["tokens"]),
                str(r["steps"]),
                str(r["forced_tokens"]),
                f"{r['vs_free_text']:.2f}x",
                f"{r['vs_forced_off']:.2f}x",
            )
    console.print(table)
    for batch in (1, 8):
        overhead = (
            results[f"free text|{batch}"]["tok_s"] / results[f"json_schema, forced off|{batch}"]["tok_s"] - 1
        )
        gain = results[f"json_schema, forced on|{batch}"]["vs_forced_off"]
        decode = {s: results[f"{s}|{batch}"]["decode_tok_s"] for s in SUBJECTS}
        decode_overhead = decode["free text"] / decode["json_schema, forced off"] - 1
        decode_gain = decode["json_schema, forced on"] / decode["json_schema, forced off"]
        console.print(
            f"batch {batch}: grammar overhead per token {100 * overhead:+.1f} % (target <= 10 %), "
            f"forced tokens {gain:.2f}x (target >= 1.3x); decode steps only: {100 * decode_overhead:+.1f} %, "
            f"{decode_gain:.2f}x"
        )
    write_result(
        "structured_output", {"args": vars(args), "results": results, **load.finish(console)}, [table]
    )


if __name__ == "__main__":
    main()
