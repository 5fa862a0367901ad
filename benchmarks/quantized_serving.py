"""Quantized weights in llmopt's engine, with PyTorch's weight-only kernels (bf16 activations) against the
engine's int4 / int8 panel kernel (int8 activations, llmopt/engine/kernels/quantized_matmul.cpp):
in-process decode tok/s at batch 1 / 4 / 16 and perplexity, for fp32, INT8, GPTQ, AWQ and, where the
engine serves it natively (`--dtype auto`), the bundled Q4_1 GGUF. Prints the table with ratios to fp32
and writes results/quantized_serving.json.

    .venv/bin/python benchmarks/quantized_serving.py [--rounds 3] [--quick]

Checkpoints: results/quantized/{int8,gptq,awq} (make them with benchmarks/quantization.py); absent ones
are left out. Every engine is loaded once, then they take turns over --rounds rounds (a different one
first each round); each speed is the best round, min-max beside it. Batch 1 is timed from the first token
(prefill excluded), batch 4 / 16 from submission (short prompts, so decode dominates). Perplexity: the
held-out half of the built-in corpus, 8 windows of 512 tokens, with each kernel run at every row count
(ATen's otherwise run prefill-sized batches dequantized, which would hide what bf16 activations cost;
the panel kernel runs every batch size itself).
--quick: fp32 and GPTQ, 8 tokens, one 128-token window, one round: a smoke run (mostly loading).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from harness import MachineLoad, rotated, spread
from quantization import decode_b1, decode_batch, generate
from rich.console import Console
from rich.table import Table

from llmopt.checkpoints import bundled_gguf_path, reference_folder
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers import quantized_linear
from llmopt.engine.llm_engine import LLMEngine
from llmopt.evaluate.perplexity import perplexity
from results import RESULTS, write_result

METHODS = ("int8", "gptq", "awq")
KERNELS = {"aten": "ATen weight-only (bf16 act.)", "auto": "panel kernel (int8 act.)"}


@dataclass
class Subject:
    name: str
    model: str
    dtype: str = "float32"
    kernel: str = "auto"  # LLMOPT_QUANT_KERNEL while it loads (the choice is made per layer at load)


@contextlib.contextmanager
def quant_kernel(choice: str) -> Iterator[None]:
    before = os.environ.get("LLMOPT_QUANT_KERNEL")
    os.environ["LLMOPT_QUANT_KERNEL"] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ["LLMOPT_QUANT_KERNEL"]
        else:
            os.environ["LLMOPT_QUANT_KERNEL"] = before


@contextlib.contextmanager
def kernel_at_every_row_count() -> Iterator[None]:
    before = quantized_linear.DEQUANTIZE_FROM_ROWS
    quantized_linear.DEQUANTIZE_FROM_ROWS = 2**31
    try:
        yield
    finally:
        quantized_linear.DEQUANTIZE_FROM_ROWS = before


def subjects(args: argparse.Namespace, console: Console) -> list[Subject]:
    found = [Subject("fp32", str(reference_folder()))]
    for method in ("gptq",) if args.quick else METHODS:
        path = RESULTS / "quantized" / method
        if not (path / "config.json").is_file():
            console.print(f"[yellow]no {method} checkpoint at {path}: left out[/yellow]")
            continue
        found += [Subject(method, str(path), kernel=kernel) for kernel in KERNELS]
    if not args.quick:  # the GGUF read at its own precision, where the engine does that
        found += [Subject("gguf-q4_1", str(bundled_gguf_path()), "auto", kernel) for kernel in KERNELS]
    return found


def load_engines(found: list[Subject], console: Console) -> dict[str, LLMEngine]:
    engines = {}
    for s in found:
        key = f"{s.name}/{s.kernel}"
        console.print(f"loading {key} ...")
        try:
            with quant_kernel(s.kernel):
                engine = LLMEngine(
                    EngineConfig(model=s.model, dtype=s.dtype, num_kv_blocks=128, enable_prefix_caching=False)
                )
        except Exception as exc:  # e.g. a GGUF the engine cannot serve natively yet
            console.print(f"[yellow]{key} left out: {str(exc)[:200]}[/yellow]")
            continue
        generate(engine, ["warm-up", "warm-up, too"], 4)  # first-call costs
        engines[key] = engine
    return engines


def speed_rounds(engines: dict[str, LLMEngine], args: argparse.Namespace, console: Console) -> dict:
    speeds: dict[str, dict[int, list[float]]] = {key: {b: [] for b in args.batches} for key in engines}
    for round_index in range(args.rounds):
        for key in rotated(list(engines), round_index):
            console.print(f"[{round_index + 1}/{args.rounds}] {key} ...")
            for batch in args.batches:
                engine = engines[key]
                if batch == 1:
                    speeds[key][batch].append(decode_b1(engine, args.tokens))
                else:
                    speeds[key][batch].append(decode_batch(engine, batch, args.tokens))
    return speeds


def perplexities(found: list[Subject], keys: set[str], args: argparse.Namespace, console: Console) -> dict:
    out = {}
    for s in found:
        key = f"{s.name}/{s.kernel}"
        if key in keys:
            console.print(f"perplexity of {key} ...")
            with quant_kernel(s.kernel), kernel_at_every_row_count():
                out[key] = perplexity(s.model, None, args.seq_len, args.windows, dtype=s.dtype).perplexity
    return out


def print_table(rows: list[dict], args: argparse.Namespace, load: MachineLoad, console: Console) -> Table:
    title = (
        f"Quantized decode in llmopt's engine (ratios to fp32); best of {args.rounds} rounds, min-max beside;"
        f" perplexity: {args.windows} windows of {args.seq_len} tokens"
    )
    table = Table(title=load.title(title))
    for col in ("weights", "kernel", *(f"batch-{b} tok/s" for b in args.batches), "perplexity"):
        table.add_column(col, justify="left" if col in ("weights", "kernel") else "right")
    for r in rows:
        cells = [
            f"{r['tok_s'][b]:.1f} ({r['ratio'][b]:.2f}x) [{spread(r['rounds'][b])}]" for b in args.batches
        ]
        ppl = f"{r['perplexity']:.3f} ({r['perplexity_change']:+.1%})"
        table.add_row(r["weights"], r["kernel"], *cells, ppl)
    console.print(table)
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds in which the engines take turns")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each request decodes")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per perplexity window")
    ap.add_argument("--quick", action="store_true", help="a smoke run: fp32 and GPTQ, tiny sizes")
    args = ap.parse_args()
    args.batches = (1, 4, 16)
    if args.quick:
        args.rounds, args.tokens, args.windows, args.seq_len, args.batches = 1, 8, 1, 128, (1, 4)
    if args.rounds < 1 or args.tokens < 2 or args.windows < 1 or args.seq_len < 2:
        ap.error("--rounds and --windows must be at least 1, --tokens and --seq-len at least 2")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console)
    found = subjects(args, console)
    engines = load_engines(found, console)
    speeds = speed_rounds(engines, args, console)
    del engines  # their memory, before the perplexity runs load each model again
    ppl = perplexities(found, set(speeds), args, console)
    base = speeds["fp32/auto"]
    rows = []
    for key, runs in speeds.items():
        weights, kernel = key.split("/")
        best = {b: max(v) for b, v in runs.items()}
        rows.append(
            {
                "weights": weights,
                "kernel": "fp32 packed" if weights == "fp32" else KERNELS[kernel],
                "tok_s": best,
                "rounds": runs,
                "ratio": {b: best[b] / max(base[b]) for b in best},
                "perplexity": ppl[key],
                "perplexity_change": ppl[key] / ppl["fp32/auto"] - 1,
            }
        )
    table = print_table(rows, args, load, console)
    out = {"args": vars(args), "kept": "speeds: the best round; rounds lists every round", "results": rows}
    name = "quantized_serving_quick" if args.quick else "quantized_serving"
    path = write_result(name, {**out, **load.finish(console)}, [table])
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
