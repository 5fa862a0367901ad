"""Quantization in one run: quantize the default model with INT8, GPTQ-4 and AWQ-4 (llm-compressor),
then measure each checkpoint and the fp32 baseline in our engine: size, perplexity on the held-out half
of the built-in corpus, batch-1 and batch-16 decode tok/s. Prints the table with ratios to fp32 and
writes results/quantization.json.

    .venv/bin/python benchmarks/quantization.py [--reuse] [--only int8,gptq] [--rounds 3]

Checkpoints go to results/quantized/<method>; --reuse measures existing ones without re-quantizing.
Speeds: every checkpoint is loaded once, then the checkpoints take turns over --rounds rounds (a different
one first each round); each speed is the best round, with the min-max of all rounds beside it. Prefix
caching is off for the speed runs, so no round is served from an earlier one's cache. Perplexity and
size are deterministic and measured once.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness import MachineLoad, rotated, spread
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.checkpoints import reference_folder
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from llmopt.evaluate.perplexity import perplexity
from llmopt.quant.quant_report import REPORT_FILE, checkpoint_size_mb
from llmopt.quant.quantize import QuantizeConfig, quantize
from results import RESULTS, write_result

METHODS = ("int8", "gptq", "awq")


def generate(engine: LLMEngine, prompts: list[str], tokens: int) -> tuple[int, float, float]:
    """Greedy, `tokens` each; (output tokens, seconds from submission to the end, seconds from the first
    output token to the end)."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    count, first = 0, None
    start = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            first = first or time.perf_counter()
            count += len(out.new_token_ids)
    end = time.perf_counter()
    return count, end - start, end - first


def decode_b1(engine: LLMEngine, tokens: int) -> float:
    """Batch-1 greedy decode tok/s, prefill excluded (timed from the first token to the last)."""
    count, _, decoding = generate(engine, ["Write a short story about a lighthouse keeper."], tokens)
    return (count - 1) / decoding


def decode_batch(engine: LLMEngine, batch: int, tokens: int) -> float:
    """Output tok/s of `batch` requests decoded together (short prompts, so decode dominates)."""
    prompts = [f"Write a story about lighthouse number {i}." for i in range(batch)]
    count, wall, _ = generate(engine, prompts, tokens)
    return count / wall


def checkpoints_to_measure(args: argparse.Namespace, console: Console) -> tuple[dict[str, Path], dict]:
    """fp32 and each method's checkpoint (quantized now unless --reuse finds one), and quantize seconds."""
    checkpoints: dict[str, Path] = {"fp32": reference_folder()}
    seconds: dict[str, float | None] = {"fp32": None}
    for method in args.only.split(","):
        out = RESULTS / "quantized" / method
        if not (args.reuse and (out / REPORT_FILE).is_file()):
            console.print(f"quantizing with {method} ...")
            quantize(QuantizeConfig(model=None, out=out, method=method, eval_windows=1, overwrite=True))
        checkpoints[method] = out
        seconds[method] = json.loads((out / REPORT_FILE).read_text())["seconds"]
    return checkpoints, seconds


def speed_rounds(checkpoints: dict[str, Path], args: argparse.Namespace, console: Console) -> dict[str, dict]:
    """Every checkpoint's batch-1 and batch-N speeds, round after round, taking turns."""
    engines = {}
    for name, path in checkpoints.items():
        console.print(f"loading {name} ...")
        engine = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=256, enable_prefix_caching=False))
        generate(engine, ["warm-up", "warm-up, too"], 4)  # kernel build and first-call costs
        engines[name] = engine
    speeds: dict[str, dict[str, list[float]]] = {name: {"b1": [], "batch": []} for name in checkpoints}
    for round_index in range(args.rounds):
        for name in rotated(list(checkpoints), round_index):
            console.print(f"[{round_index + 1}/{args.rounds}] {name} ...")
            speeds[name]["b1"].append(decode_b1(engines[name], args.b1_tokens))
            speeds[name]["batch"].append(decode_batch(engines[name], args.batch, args.batch_tokens))
    return speeds


def print_table(rows: list[dict], args: argparse.Namespace, load: MachineLoad, console: Console) -> Table:
    title = (
        f"Quantized checkpoints in llmopt's engine (ratios to fp32); speeds: best of {args.rounds} rounds "
        "(checkpoints take turns), min-max of the rounds beside"
    )
    table = Table(title=load.title(title))
    columns = (
        "checkpoint",
        "quantize s",
        "size MB",
        "perplexity",
        "batch-1 tok/s",
        f"batch-{args.batch} tok/s",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "checkpoint" else "right")
    for r in rows:
        table.add_row(
            r["checkpoint"],
            "-" if r["quantize_s"] is None else f"{r['quantize_s']:.0f}",
            f"{r['size_mb']:.0f}",
            f"{r['perplexity']:.3f} ({r['perplexity_change'] * 100:+.1f} %)",
            f"{r['decode_b1_tok_s']:.1f} ({r['b1_ratio']:.2f}x) [{spread(r['decode_b1_rounds'])}]",
            f"{r['decode_batch_tok_s']:.1f} ({r['batch_ratio']:.2f}x) [{spread(r['decode_batch_rounds'])}]",
        )
    console.print(table)
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reuse", action="store_true", help="measure existing checkpoints, do not re-quantize")
    ap.add_argument("--only", default=",".join(METHODS), help="comma-separated subset of int8,gptq,awq")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens")
    ap.add_argument("--rounds", type=int, default=3, help="rounds in which the checkpoints take turns")
    ap.add_argument("--b1-tokens", type=int, default=128, help="tokens of the batch-1 decode")
    ap.add_argument("--batch", type=int, default=16, help="requests decoded together")
    ap.add_argument("--batch-tokens", type=int, default=64, help="tokens each of the batch decode")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: the checkpoints take turns over rounds")
    if unknown := set(args.only.split(",")) - set(METHODS):
        ap.error(f"unknown methods {sorted(unknown)}: choose from {','.join(METHODS)}")
    if args.b1_tokens < 2 or args.batch < 1 or args.batch_tokens < 1:
        ap.error("--b1-tokens must be at least 2, --batch and --batch-tokens at least 1")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    checkpoints, seconds = checkpoints_to_measure(args, console)
    speeds = speed_rounds(checkpoints, args, console)
    rows = []
    for name, path in checkpoints.items():
        console.print(f"perplexity of {name} ...")
        rows.append(
            {
                "checkpoint": name,
                "quantize_s": seconds[name],
                "size_mb": checkpoint_size_mb(path),
                "perplexity": perplexity(str(path), None, 512, args.windows).perplexity,
                "decode_b1_tok_s": max(speeds[name]["b1"]),
                "decode_b1_rounds": speeds[name]["b1"],
                "decode_batch_tok_s": max(speeds[name]["batch"]),
                "decode_batch_rounds": speeds[name]["batch"],
            }
        )
    base = rows[0]
    for r in rows:
        r["perplexity_change"] = r["perplexity"] / base["perplexity"] - 1
        r["b1_ratio"] = r["decode_b1_tok_s"] / base["decode_b1_tok_s"]
        r["batch_ratio"] = r["decode_batch_tok_s"] / base["decode_batch_tok_s"]
    table = print_table(rows, args, load, console)
    out = {"args": vars(args), "kept": "speeds: the best round; *_rounds lists every round", "results": rows}
    write_result("quantization", {**out, **load.finish(console)}, [table])


if __name__ == "__main__":
    main()
