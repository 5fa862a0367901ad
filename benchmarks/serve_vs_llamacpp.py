"""`llmopt serve` against llama.cpp's own server on the same weights: a thin script over
recipes/engines.toml. The recipe's workload, load and rounds (streamed chat, prompt 128, output 128
tokens, concurrency 1, 4, 16, keep-alive on, two rounds) with its configs replaced by llmopt with no flags
(the bundled Q4_1 GGUF in its own 4-bit blocks), llmopt `--dtype float32` (the exact reference), any
--quantized llmopt checkpoint, llama.cpp on an F32 copy of the bundled GGUF (exactly the fp32 weights
llmopt serves) and llama.cpp on the bundled Q4_1 GGUF (what its users run). `llmopt bench` runs them as it
runs the recipe: one server at a time, round 1 of every server then round 2 of every one, fresh prompts
per round and the same for every server within one (llmopt/bench/sweep/rounds.py). Writes the run folder
results/serve_vs_llamacpp/ (summary.json, requests, report.html) and results/serve_vs_llamacpp.json, and
prints each server's output tok/s over llmopt fp32's and llama.cpp's. Issue #35's goal at 16 streams:
llmopt with no flags >= 2x llmopt fp32 and >= 3x llama.cpp Q4_1. The run refuses to start when the
1-minute load average is above 0.5 (another job would be measured too), unless --allow-busy.

    make peers                                   # once: llama.cpp's server (xllamacpp) in .peer-venv
    .venv/bin/python benchmarks/serve_vs_llamacpp.py [--concurrency 1,4,16] [--rounds 2]
        [--num-requests 32] [--quantized results/quantized/gptq]   # a 4-bit checkpoint of `llmopt quantize`

`llmopt bench --recipe recipes/engines.toml` runs the same comparison with vLLM in place of the F32 copy
and the checkpoints. llama.cpp's Python: $LLMOPT_LLAMA_CPP_PYTHON, else .peer-venv in the current folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from gguf_f32 import write_f32_copy
from harness import MachineLoad, spread
from rich.console import Console
from rich.table import Table

from llmopt.bench import BenchConfig, BenchError, PointSummary, RunDir, ServerSpec, load_recipe
from llmopt.checkpoints import bundled_gguf_path, load_tokenizer, resolve_model
from llmopt.cli.bench_run import run_bench
from results import RESULTS, write_result

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "engines.toml"
RUN = RESULTS / "serve_vs_llamacpp"
FP32 = "llmopt-fp32"
F32 = "llama.cpp-F32"
Q4 = "llama.cpp-Q4_1"


def configs(recipe: BenchConfig, args: argparse.Namespace, f32: Path) -> list[ServerSpec]:
    """The recipe's llmopt and llama.cpp configs, with enough slots for the highest concurrency: llmopt
    as started with no flags, in fp32 and on each checkpoint, llama.cpp on the F32 copy and on the Q4_1
    file."""
    [ours] = [s for s in recipe.servers if s.engine == "llmopt"]
    [peer] = [s for s in recipe.servers if s.engine == "llama.cpp"]
    slots = {"max-num-seqs": max(args.concurrency + [ours.args.get("max-num-seqs", 1)])}
    ours, peer = (dataclasses.replace(s, args={**s.args, **slots}) for s in (ours, peer))
    return [
        dataclasses.replace(ours, name="llmopt"),
        dataclasses.replace(ours, name=FP32, args={**ours.args, "dtype": "float32"}),
        *[dataclasses.replace(ours, name=f"llmopt-{path.name}", model=str(path)) for path in args.quantized],
        dataclasses.replace(peer, name=F32, model=str(f32)),
        dataclasses.replace(peer, name=Q4),
    ]


def print_table(points: list[PointSummary], load: MachineLoad, console: Console) -> Table:
    """Per concurrency and server: output tok/s over every round (each round's beside it), latencies,
    the tokens each server said it served from its cache, and tok/s over llmopt fp32's and llama.cpp's."""
    table = Table(title=load.title("streamed chat, every round pooled; rounds: each round's output tok/s"))
    table.caption = load.busy
    columns = ["concurrency", "server", "requests", "output tok/s", "rounds", "TTFT p50 ms", "TTFT p90 ms"]
    for col in columns + ["ITL p50 ms", "cached tok", "÷ llmopt fp32", "÷ llama.cpp F32", "÷ llama.cpp Q4_1"]:
        table.add_column(col, justify="right")
    by = {(p.server, p.concurrency): p for p in points}
    for c in sorted({p.concurrency for p in points}):
        for p in (p for p in points if p.concurrency == c):
            rounds = p.repeats.metrics["output_throughput"].values
            tok_s = p.output_throughput
            table.add_row(
                str(c),
                p.server,
                str(p.successful),
                f"{tok_s:.1f}",
                spread(rounds),
                f"{p.ttft_ms['median']:.0f}",
                f"{p.ttft_ms['p90']:.0f}",
                f"{p.itl_ms['median']:.1f}",
                str(p.cached_tokens),
                *(f"{tok_s / by[(peer, c)].output_throughput:.2f}x" for peer in (FP32, F32, Q4)),
            )
    console.print(table)
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--num-requests", type=int, help="requests per point and round (default: the recipe's)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds in which the servers take turns")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--quantized", type=Path, action="append", default=[], help="llmopt checkpoints to add")
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine, marked as no result")
    args = ap.parse_args()
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency is a list of numbers, like 1,4,16: not {args.concurrency!r}")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: the servers take turns over rounds")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    recipe = load_recipe(RECIPE)
    console.print("F32 copy of the GGUF (once) ...")
    f32 = write_f32_copy(bundled_gguf_path(), RESULTS / "peer-models" / "SmolLM2-135M-Instruct.F32.gguf")
    given = {"concurrencies": args.concurrency, "rounds": args.rounds, "prompt_lens": [args.prompt_len]}
    given |= {"output_lens": [args.output_len], "recipe": str(RECIPE)}
    if args.num_requests is not None:
        given["num_requests"] = args.num_requests
    config = recipe.replaced({"servers": configs(recipe, args, f32), **given})
    try:
        config.validate()
        for server in config.servers:  # the peer installed, before the old run folder goes
            server.check_engine(installed=True)
    except BenchError as exc:
        raise SystemExit(f"{exc}\n(llama.cpp's peer: `make peers`, or $LLMOPT_LLAMA_CPP_PYTHON)") from None
    shutil.rmtree(RUN, ignore_errors=True)  # each run measures afresh (the recipe's own runs resume)
    code = run_bench(config, RUN, False, load_tokenizer(resolve_model()), console)
    points = RunDir(RUN).load_summaries()
    table = print_table(points, load, console)
    out = {"args": vars(args), "run": RUN, "points": [p.to_json() for p in points]}
    write_result("serve_vs_llamacpp", {**out, **load.finish(console)}, [table])  # writes Paths as text
    raise SystemExit(code)


if __name__ == "__main__":
    main()
