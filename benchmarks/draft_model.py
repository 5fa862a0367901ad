"""A draft model against no speculation at one stream, paired in one process (issue #51: the 0.5B
Qwen2.5-Coder drafting for the 1.5B). Three engines of the same target take turns step by step on the
same fresh prompts (spec_policy.py's workloads, arrivals and pairing): no speculation, the draft as
llmopt runs it by default (`draft_weights` "q4_0": its Q5_0 layers and Q8_0 head requantized to Q4_0 at
load) and the draft as its file stores it ("file"). Greedy, every answer to its full length, the text of
all three checked equal. Code first, then chat, as a server's traffic may change: the code phase is what
a draft is for, the chat phase what it costs where its proposals do not pay, arriving at an engine that
the code phase left drafting.

Per workload: each mode's output tok/s (mean over repeats), its ratio to no speculation (the mean of each
repeat's paired ratio) and the lowest pair, its acceptance and tokens per verification. Refuses a busy
machine (1-minute load over 0.5) unless --allow-busy. Writes results/draft_model_<model>.json.

    .venv/bin/python benchmarks/draft_model.py [--model qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
        [--repeats 4] [--tokens 4]
"""

from __future__ import annotations

import argparse
import json
import statistics

from harness import CorpusCursor, MachineLoad
from real_models import MODELS, model_argument, result_name
from rich.console import Console
from rich.table import Table
from spec_policy import WORKLOADS, Arrivals, Prompts, Run, engine_for, run_in_turns

from results import write_result

DRAFT_MODES = ("q4_0", "file")
PHASES = ("code", "chat")


def draft_config(draft: str, weights: str, tokens: int) -> str:
    return json.dumps(
        {"method": "draft", "model": draft, "num_speculative_tokens": tokens, "draft_weights": weights}
    )


def measure(engines: dict, repeats: int, console: Console) -> dict[str, dict[str, list[Run]]]:
    """Per workload and mode, one run a repeat (the same prompts for every mode)."""
    prompts = Prompts(engines["off"], CorpusCursor(engines["off"].tokenizer))
    for engine in engines.values():  # each mode's first steps (and its first measured costs) untimed
        run_in_turns([Arrivals(engine, prompts.take("chat", 1), 1, 16)])
    runs: dict[str, dict[str, list[Run]]] = {name: {m: [] for m in engines} for name in PHASES}
    for workload in sorted(WORKLOADS, key=lambda w: PHASES.index(w.name)):
        for repeat in range(repeats):
            batch = prompts.take(workload.name, 2)
            arrivals = {
                mode: Arrivals(engine, batch, 1, workload.output_len) for mode, engine in engines.items()
            }
            run_in_turns(list(arrivals.values()))
            done = {mode: a.run() for mode, a in arrivals.items()}
            assert all(r.outputs == done["off"].outputs for r in done.values()), "a draft changed greedy text"
            for mode, run in done.items():
                runs[workload.name][mode].append(run)
            ratios = ", ".join(f"{m} {done[m].tok_s / done['off'].tok_s:.3f}x" for m in DRAFT_MODES)
            console.print(
                f"{workload.name}, repeat {repeat + 1}: off {done['off'].tok_s:.1f} tok/s, {ratios}"
            )
    return runs


def summary(runs: list[Run], off: list[Run]) -> dict:
    ratios = [r.tok_s / o.tok_s for r, o in zip(runs, off)]
    proposed, accepted, drafts = (
        sum(getattr(r, k) for r in runs) for k in ("proposed", "accepted", "drafts")
    )
    return {
        "tok_s": [r.tok_s for r in runs],
        "paired_ratios": ratios,
        "acceptance": accepted / proposed if proposed else None,
        "tokens_per_verification": 1 + accepted / drafts if drafts else None,
    }


def table(results: dict[str, dict[str, dict]], title: str, load: MachineLoad) -> Table:
    t = Table(title=load.title(title))
    t.caption = load.busy
    for column in ("workload", "draft weights", "tok/s", "off tok/s", "ratio", "lowest pair", "acceptance"):
        t.add_column(column, justify="left" if column in ("workload", "draft weights") else "right")
    t.add_column("tokens/verification", justify="right")
    for workload, modes in results.items():
        off = statistics.mean(modes["off"]["tok_s"])
        for mode in DRAFT_MODES:
            s = modes[mode]
            t.add_row(
                workload,
                mode,
                f"{statistics.mean(s['tok_s']):.1f}",
                f"{off:.1f}",
                f"{statistics.mean(s['paired_ratios']):.3f}x",
                f"{min(s['paired_ratios']):.3f}x",
                "-" if s["acceptance"] is None else f"{s['acceptance']:.0%}",
                "-" if s["tokens_per_verification"] is None else f"{s['tokens_per_verification']:.2f}",
            )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="of " + ", ".join(MODELS) + ", or a .gguf")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft model, as --model")
    ap.add_argument("--repeats", type=int, default=4, help="paired runs of each workload, on fresh prompts")
    ap.add_argument("--tokens", type=int, default=4, help="num_speculative_tokens (the most a step drafts)")
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    args = ap.parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    model, draft = model_argument(args.model), model_argument(args.draft)
    engines = {"off": engine_for(model, "off", 1)}
    engines |= {mode: engine_for(model, draft_config(draft, mode, args.tokens), 1) for mode in DRAFT_MODES}
    runs = measure(engines, args.repeats, console)
    results = {
        workload: {mode: summary(mode_runs, modes["off"]) for mode, mode_runs in modes.items()}
        for workload, modes in runs.items()
    }
    title = (
        f"{args.draft} drafting for {args.model} against no speculation, one stream, paired in one process, "
        f"greedy, fresh prompts, {args.repeats} repeats taking turns step by step"
    )
    printed = table(results, title, load)
    console.print(printed)
    out = {"args": vars(args), "results": results}
    name = result_name("draft_model", args.model)
    console.print(f"wrote {write_result(name, {**out, **load.finish(console)}, [printed])}")


if __name__ == "__main__":
    main()
