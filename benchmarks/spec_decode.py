"""Speculative decoding against plain decoding, in one run: batch 1 and 4, a copy-heavy workload (the
answer repeats the prompt) and a free-writing one, with speculation off, n-gram k=3/5 and draft k=3/5.
Greedy, so every configuration produces the same tokens (checked): only the speed differs.
Configurations take turns on each workload (best of --repeats runs each), so the machine's drift over
the run stays out of the ratios. Prints tok/s, acceptance rate and speed-up; writes
results/spec_decode.json.

    .venv/bin/python benchmarks/spec_decode.py [--draft-model PATH] [--max-tokens 128] [--repeats 3]

The draft defaults to the target itself (acceptance at its ceiling, no speed-up: it costs as much as
the target); pass a cheaper model, such as an int8 or int4 copy, to measure a real draft.

Every run sends the same prompts (the outputs are compared across configurations), so prefix caching is
off: no run's prefill is served from an earlier run's cache.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import MachineLoad, rotated
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.checkpoints import resolve_model
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from results import write_result

PASSAGES = [
    "The Python interpreter reads a program line by line. Each line is split into tokens, the tokens are "
    "parsed into a tree, and the tree is compiled into bytecode that a virtual machine executes.",
    "A paged KV cache stores the keys and values of every sequence in fixed-size blocks. A block table maps "
    "each sequence's positions to blocks, so memory is allocated as the sequence grows.",
    "Speculative decoding drafts several tokens cheaply and verifies them in one forward pass of the large "
    "model. Accepted tokens cost one pass instead of several, and the output does not change.",
    "Continuous batching lets new requests join a running batch at every step instead of waiting for the "
    "whole batch to finish, which keeps the hardware busy and the queue short.",
]
TOPICS = ["a lighthouse keeper", "a robot learning to paint", "a city under the sea", "the last train home"]


def workloads() -> dict[str, list[str]]:
    return {
        "copy-heavy": [f"Repeat the following text exactly, word for word:\n\n{p}" for p in PASSAGES],
        "free-writing": [f"Write a short story about {t}." for t in TOPICS],
    }


def run(
    engine: LLMEngine, prompts: list[list[int]], batch: int, max_tokens: int
) -> tuple[float, list[list[int]]]:
    engine.scheduler.max_num_seqs = batch
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    ids = [engine.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return time.perf_counter() - start, [tokens[i] for i in ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft-model", default=None, help="default: the target itself")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs of each configuration, interleaved; best kept"
    )
    ap.add_argument("--lookup-min", type=int, default=None, help="prompt_lookup_min for the n-gram runs")
    ap.add_argument("--only", default=None, help="comma-separated subset of configs, e.g. 'off,ngram k=3'")
    args = ap.parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    target = str(resolve_model())
    draft = args.draft_model or target
    configs = {
        "off": None,
        "ngram k=3": {"method": "ngram", "num_speculative_tokens": 3},
        "ngram k=5": {"method": "ngram", "num_speculative_tokens": 5},
        "draft k=3": {"method": "draft", "model": draft, "num_speculative_tokens": 3},
        "draft k=5": {"method": "draft", "model": draft, "num_speculative_tokens": 5},
    }
    if args.lookup_min:
        for spec in configs.values():
            if spec and spec["method"] == "ngram":
                spec["prompt_lookup_min"] = args.lookup_min
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only.split(",")}
    results: dict[str, dict] = {}
    reference: dict[tuple[str, int], list[list[int]]] = {}
    engines = {
        name: LLMEngine(
            EngineConfig(
                model=target, speculative_config=spec, num_kv_blocks=512, enable_prefix_caching=False
            )
        )
        for name, spec in configs.items()
    }
    for workload, texts in workloads().items():
        first = next(iter(engines.values()))  # every engine has the target's tokenizer
        prompts = [first.chat_token_ids([{"role": "user", "content": t}]) for t in texts]
        for engine in engines.values():
            run(engine, prompts[:1], 1, 8)  # warm-up
        for batch in (1, 4):
            console.print(f"{workload}, batch {batch} ...")
            # Configurations take turns (a different one first each round), best of --repeats each: the
            # machine's speed drifts over a run, and interleaving keeps that drift out of the ratios.
            for repeat in range(args.repeats):
                for name in rotated(list(engines), repeat):
                    engine = engines[name]
                    before = engine.stats()
                    seconds, outputs = run(engine, prompts, batch, args.max_tokens)
                    after = engine.stats()
                    key = (workload, batch)
                    reference.setdefault(key, outputs)
                    assert outputs == reference[key], f"{name} changed the greedy output of {workload}"
                    drafted = after.spec_draft_tokens - before.spec_draft_tokens
                    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
                    steps = after.spec_drafts - before.spec_drafts
                    previous = results.get(f"{name}|{workload}|{batch}")
                    if previous and previous["seconds"] <= seconds:
                        continue
                    results[f"{name}|{workload}|{batch}"] = {
                        "config": name,
                        "workload": workload,
                        "batch": batch,
                        "tokens": sum(map(len, outputs)),
                        "seconds": seconds,
                        "tok_s": sum(map(len, outputs)) / seconds,
                        "acceptance_rate": accepted / drafted if drafted else None,
                        "mean_acceptance_length": 1 + accepted / steps if steps else None,
                    }
    del engines

    table = Table(
        title=load.title(
            f"speculative decoding, greedy, {args.max_tokens} max tokens, draft = {Path(draft).name}; "
            f"best of {args.repeats} (configurations take turns), prefix caching off"
        )
    )
    for col in ("workload", "batch", "config", "tok/s", "speed-up", "acceptance", "tokens/step"):
        table.add_column(col, justify="right")
    for r in results.values():
        base = results[f"off|{r['workload']}|{r['batch']}"]["tok_s"]
        r["speedup"] = r["tok_s"] / base
    for workload in workloads():
        for batch in (1, 4):
            for name in configs:
                if f"{name}|{workload}|{batch}" not in results:
                    continue
                r = results[f"{name}|{workload}|{batch}"]
                table.add_row(
                    workload,
                    str(batch),
                    name,
                    f"{r['tok_s']:.1f}",
                    f"{r['speedup']:.2f}x",
                    "-" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.0f}%",
                    "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}",
                )
    console.print(table)
    write_result("spec_decode", {"args": vars(args), "results": results, **load.finish(console)}, [table])


if __name__ == "__main__":
    main()
