"""--kv-cache-dtype int8 against the fp32 cache, on the default model (issue #20's targets in brackets):

- decode attention: torch.ops.llmopt.paged_decode_attention_int8 against the fp32
  paged_decode_attention, 16 rows of 200 and 2,048 cached tokens, cold caches (each call reads a
  different copy, cycling through --cold-mb of them), subjects taking turns, median of --repeats
  [int8 >= 1.6x faster at 2,048];
- perplexity: the engine's forward (ModelRunner.prompt_logits, the prefill path reading the int8 cache
  through gather-then-dequantize) over --windows windows of --seq-len held-out tokens, as
  `llmopt eval` scores them [int8 within +0.5 %];
- sequences that fit a 1 GiB pool: the runner's KV blocks for --kv-cache-memory-gb, and how many
  sequences of 512 / 2,048 tokens they hold [int8 >= 1.9x].

Prints the tables and writes results/kv_cache_int8.json.

    .venv/bin/python benchmarks/kv_cache_int8.py [--repeats 7] [--windows 8] [--seq-len 512]
    .venv/bin/python benchmarks/kv_cache_int8.py --quick   # smoke run: tiny sizes, not a result
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
from harness import MachineLoad
from kernels import copies_for, take_turns
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig

from llmopt.checkpoints import load_tokenizer, resolve_model
from llmopt.engine import kernels as engine_kernels
from llmopt.engine.block_manager import num_blocks_for
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers import int8_kv_cache
from llmopt.engine.model_runner import ModelRunner
from llmopt.evaluate.eval_text import eval_windows, split_tokens
from llmopt.evaluate.perplexity import window_nll
from results import write_result

ROWS = 16
CONTEXTS = (200, 2048)
SEQUENCE_LENGTHS = (512, 2048)
DTYPES = ("auto", "int8")  # auto: the model's fp32


def attention_subjects(config, context: int, cold_bytes: int) -> dict[str, tuple]:
    """Both kernels over copies of one pool each: ROWS rows of `context` tokens, blocks scattered over
    the pool as a running engine leaves them; the int8 pool is the fp32 one quantized."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    block = EngineConfig().block_size
    per_row = math.ceil(context / block)
    num_blocks = ROWS * per_row
    fp32_pools, int8_pools = [], []
    for _ in range(copies_for(2 * num_blocks * block * kv_heads * head_dim * 4, cold_bytes)):
        k, v = torch.randn(2, num_blocks, block, kv_heads, head_dim)
        fp32_pools.append((k, v))
        int8_pools.append((int8_kv_cache.quantize(k), int8_kv_cache.quantize(v)))
    q = torch.randn(ROWS, heads, head_dim)
    tables = torch.randperm(num_blocks).view(ROWS, per_row)
    lens = torch.full((ROWS,), context)
    scale = head_dim**-0.5

    def fp32(pool):
        return torch.ops.llmopt.paged_decode_attention(q, pool[0], pool[1], tables, lens, scale, 0)

    def int8(pool):
        return torch.ops.llmopt.paged_decode_attention_int8(q, pool[0], pool[1], tables, lens, scale, 0)

    # Like for like: the same attention, within int8's rounding (the kernel tests check it in detail).
    assert (fp32(fp32_pools[0]) - int8(int8_pools[0])).abs().max() < 0.05
    return {"fp32": (fp32, fp32_pools), "int8": (int8, int8_pools)}


def measure_attention(config, args: argparse.Namespace, console: Console) -> list[dict]:
    results = []
    for context in args.contexts:
        console.print(f"decode attention, {ROWS} rows x {context} tokens ...")
        times = take_turns(attention_subjects(config, context, args.cold_mb * 2**20), args.repeats)
        row: dict = {"rows": ROWS, "context": context, "samples_s": times}
        for subject, samples in times.items():
            row[subject] = {"ms": 1000 * statistics.median(samples)}
        row["speedup"] = row["fp32"]["ms"] / row["int8"]["ms"]
        results.append(row)
    return results


def measure_runner(kv_cache_dtype: str, windows, args: argparse.Namespace, console: Console) -> dict:
    """Perplexity over `windows` and the pool --kv-cache-memory-gb buys, with one runner."""
    console.print(f"kv cache {kv_cache_dtype}: perplexity over {len(windows)} windows of {args.seq_len} ...")
    config = EngineConfig(kv_cache_dtype=kv_cache_dtype, kv_cache_memory_gb=args.kv_cache_memory_gb)
    runner = ModelRunner(config, resolve_model(), max_model_len=args.seq_len)
    total_nll, total_tokens = 0.0, 0
    for window in windows:
        nll, count = window_nll(runner.prompt_logits(window.token_ids), window)
        total_nll += nll
        total_tokens += count
    blocks = runner.num_kv_blocks
    return {
        "perplexity": math.exp(total_nll / total_tokens),
        "tokens": total_tokens,
        "kv_blocks": blocks,
        "kv_cache_mib": runner.kv_cache.numel() * runner.kv_cache.element_size() / 2**20,
        "sequences": {n: blocks // num_blocks_for(n, config.block_size) for n in SEQUENCE_LENGTHS},
    }


def attention_table(results: list[dict], load: MachineLoad, repeats: int) -> Table:
    table = Table(title=load.title(f"decode attention, cold KV, median of {repeats} (subjects take turns)"))
    for col in ("rows x context", "fp32 ms", "int8 ms", "speed-up [>= 1.6x]"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            f"{r['rows']} x {r['context']}",
            f"{r['fp32']['ms']:.3f}",
            f"{r['int8']['ms']:.3f}",
            f"{r['speedup']:.2f}x",
        )
    return table


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def runner_table(runs: dict[str, dict], load: MachineLoad, args: argparse.Namespace) -> Table:
    table = Table(
        title=load.title(
            f"perplexity ({args.windows} x {args.seq_len} tokens), {args.kv_cache_memory_gb} GiB pool"
        )
    )
    columns = ["kv cache", "perplexity", "vs fp32 [<= +0.5 %]", "blocks", "MiB"]
    columns += [f"{n}-token seqs [>= 1.9x]" for n in SEQUENCE_LENGTHS]
    for col in columns:
        table.add_column(col, justify="right")
    base = runs["auto"]
    for name, r in runs.items():
        seqs = [
            f"{r['sequences'][n]} ({ratio(r['sequences'][n], base['sequences'][n])})"
            for n in SEQUENCE_LENGTHS
        ]
        change = 100 * (r["perplexity"] / base["perplexity"] - 1)
        label = "fp32 (auto)" if name == "auto" else name
        table.add_row(
            label,
            f"{r['perplexity']:.4f}",
            f"{change:+.2f} %",
            str(r["kv_blocks"]),
            f"{r['kv_cache_mib']:.0f}",
            *seqs,
        )
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="attention passes per subject; the median is kept")
    ap.add_argument("--cold-mb", type=int, default=256, help="copies of each KV pool, in MiB")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per perplexity window")
    ap.add_argument(
        "--kv-cache-memory-gb", type=float, default=1.0, help="the pool whose capacity is counted"
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes (not a result)")
    args = ap.parse_args()
    args.contexts = CONTEXTS
    if args.quick:
        args.repeats, args.cold_mb, args.windows, args.seq_len = 2, 8, 1, 64
        args.kv_cache_memory_gb, args.contexts = 0.25, (200,)
    if args.repeats < 2:
        ap.error("--repeats must be at least 2: the subjects take turns")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    if args.quick:
        load.busy = "QUICK RUN (--quick): tiny sizes — not a result"
    if not engine_kernels.load():
        raise SystemExit("the compiled kernels did not build here (no C++ compiler?): nothing to measure")
    torch.manual_seed(0)
    model_dir = resolve_model()
    out: dict = {"args": vars(args), "threads": torch.get_num_threads()}
    windows = eval_windows(
        split_tokens(load_tokenizer(model_dir), None).evaluation, args.seq_len, args.windows
    )
    with torch.inference_mode():
        out["attention"] = measure_attention(AutoConfig.from_pretrained(model_dir), args, console)
        out["runs"] = {name: measure_runner(name, windows, args, console) for name in DTYPES}
    tables = [attention_table(out["attention"], load, args.repeats), runner_table(out["runs"], load, args)]
    for table in tables:
        console.print(table)
    write_result("kv_cache_int8", {**out, **load.finish(console)}, tables)


if __name__ == "__main__":
    main()
