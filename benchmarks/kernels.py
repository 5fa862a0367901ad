"""The compiled kernels against the PyTorch ops they replace, on the default model's shapes:

- dense linear: torch.ops.llmopt.packed_linear on pack_panels weights against MKL's torch.mm on the
  [in, out] layout (what the engine runs without the kernels), at 1, 4, 16, 64 and 512 rows, for every
  linear of a decoder layer (q/k/v and gate/up fused, as the engine stores them) and the output layer;
  ms per call, GB/s of weights streamed, GFLOP/s, the speed-up over MKL, and each row count's cost
  against 1 row (and the same summed over every linear of one decode step);
- decode attention: torch.ops.llmopt.paged_decode_attention against the engine's fallback (gather the
  blocks, then SDPA) for 16 rows of 200 and 2,048 cached tokens;
- prefill attention: torch.ops.llmopt.paged_prefill_attention against the engine's fallback (gather the
  blocks, then SDPA with a causal mask) for a fresh 512-token prompt and for the agent loop's later turns:
  4 rows of 130 new tokens over 2,200 cached ones;
- bf16 torch.mm against fp32 torch.mm at 16 and 512 rows.

Weights and KV caches are cold and model-sized: each call reads a different copy, cycling through
--cold-mb of them (the model streams 538 MB of weights per step, far more than any cache holds), so a
call never finds its weights in cache. Subjects take turns, a different one first each time, and each
figure is the median of --repeats passes. Prints the tables and writes results/kernels.json.

    .venv/bin/python benchmarks/kernels.py [--repeats 7] [--cold-mb 256] [--rows 1,4,16,64,512]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from harness import MachineLoad, rotated
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig

from llmopt.checkpoints import reference_folder
from llmopt.engine import kernels
from llmopt.engine.config import EngineConfig
from llmopt.engine.layers.attention import AttentionGroup, attend_decode, attend_prefill
from llmopt.engine.layers.linear import PANEL, pack_panels
from results import write_result

# The output layer only ever sees a sequence's last rows (at most a batch of decodes and their
# speculative proposals), never a 512-row prefill chunk: it is measured up to this many rows.
LM_HEAD_MAX_ROWS = 64
BF16_ROWS = (16, 512)
ATTENTION_ROWS = 16
ATTENTION_CONTEXTS = (200, 2048)


def model_shapes() -> tuple[dict[str, tuple[int, int]], dict[str, int], object]:
    """(in, out) of each linear as the engine stores it, how many of each a decode step runs; the config."""
    config = AutoConfig.from_pretrained(reference_folder())
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    shapes = {
        "qkv": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o": (heads * head_dim, hidden),
        "gate_up": (hidden, 2 * config.intermediate_size),
        "down": (config.intermediate_size, hidden),
        "lm_head": (hidden, config.vocab_size),
    }
    layers = config.num_hidden_layers
    return shapes, {"qkv": layers, "o": layers, "gate_up": layers, "down": layers, "lm_head": 1}, config


def seconds_per_call(call: Callable[[object], object], items: list) -> float:
    """One pass over every copy; the mean time of one call."""
    start = time.perf_counter()
    for item in items:
        call(item)
    return (time.perf_counter() - start) / len(items)


def take_turns(subjects: dict[str, tuple[Callable, list]], repeats: int) -> dict[str, list[float]]:
    """Every subject's pass, in turns (a different subject first each time); every pass's time per call."""
    for call, items in subjects.values():  # warm-up: first-call costs, page faults of fresh outputs
        call(items[0])
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for repeat in range(repeats):
        for name in rotated(list(subjects), repeat):
            call, items = subjects[name]
            times[name].append(seconds_per_call(call, items))
    return times


def copies_for(nbytes: int, cold_bytes: int) -> int:
    return max(2, math.ceil(cold_bytes / nbytes))


def linear_subjects(weights: dict[str, list[torch.Tensor]], rows: int, with_bf16: bool) -> dict[str, tuple]:
    """The packed kernel, MKL fp32 and (at some row counts) MKL bf16, each over its copies of one weight."""
    k = weights["mkl"][0].shape[0]
    x = torch.randn(rows, k)
    subjects = {
        "packed": (lambda w: torch.ops.llmopt.packed_linear(x, w, w.shape[0] * PANEL), weights["packed"]),
        "mkl": (lambda w: torch.mm(x, w), weights["mkl"]),
    }
    if with_bf16:
        xb = x.bfloat16()
        subjects["mkl bf16"] = (lambda w: torch.mm(xb, w), weights["mkl bf16"])
    return subjects


def measure_linears(
    shapes: dict, rows_list: list[int], args: argparse.Namespace, console: Console
) -> list[dict]:
    results = []
    for name, (k, n) in shapes.items():
        console.print(f"linear {name} {k}->{n}: weights ...")
        plain = [torch.randn(k, n) for _ in range(copies_for(k * n * 4, args.cold_mb * 2**20))]
        weights = {"mkl": plain, "packed": [pack_panels(w) for w in plain]}
        if any(r in BF16_ROWS for r in rows_list):
            weights["mkl bf16"] = [w.bfloat16() for w in plain]  # half the bytes: still far past the caches
        for rows in rows_list:
            if name == "lm_head" and rows > LM_HEAD_MAX_ROWS:
                continue
            console.print(f"linear {name} {k}->{n}, {rows} rows ...")
            times = take_turns(linear_subjects(weights, rows, rows in BF16_ROWS), args.repeats)
            row = {"linear": name, "in": k, "out": n, "rows": rows, "copies": len(plain), "samples_s": times}
            for subject, samples in times.items():
                median = statistics.median(samples)
                nbytes = k * n * weights[subject][0].element_size()
                row[subject] = {
                    "ms": 1000 * median,
                    "weight_gb_s": nbytes / median / 1e9,
                    "gflop_s": 2 * rows * k * n / median / 1e9,
                }
            results.append(row)
        del weights, plain
    return results


def attention_subjects(config, context: int, cold_bytes: int) -> dict[str, tuple]:
    """The decode kernel and gather+SDPA on copies of one pool: 16 rows of `context` tokens each, blocks
    scattered over the pool as a running engine leaves them."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    block = EngineConfig().block_size  # what the engine runs with by default
    per_row = math.ceil(context / block)
    num_blocks = ATTENTION_ROWS * per_row
    kv_bytes = 2 * num_blocks * block * kv_heads * head_dim * 4
    pools = []
    for _ in range(copies_for(kv_bytes, cold_bytes)):
        k_cache = torch.randn(num_blocks, block, kv_heads, head_dim)
        v_cache = torch.randn(num_blocks, block, kv_heads, head_dim)
        pools.append((k_cache, v_cache))
    q = torch.randn(ATTENTION_ROWS, heads, head_dim)
    tables = torch.randperm(num_blocks).view(ATTENTION_ROWS, per_row)
    lens = torch.full((ATTENTION_ROWS,), context)
    mask = (torch.arange(per_row * block)[None, :] < lens[:, None])[:, None, None, :]
    group = AttentionGroup(tables, lens, mask, None, None)
    scale = head_dim**-0.5

    def kernel(pool):
        return torch.ops.llmopt.paged_decode_attention(q, pool[0], pool[1], tables, lens, scale, 0)

    def sdpa(pool):
        return attend_decode(q, pool[0], pool[1], group, kv_heads, scale)

    # Like for like: both compute the same attention (the kernel tests check this in detail).
    torch.testing.assert_close(kernel(pools[0]), sdpa(pools[0]), rtol=1e-4, atol=1e-4)
    return {"kernel": (kernel, pools), "gather+sdpa": (sdpa, pools)}


def measure_attention(config, args: argparse.Namespace, console: Console) -> list[dict]:
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    results = []
    for context in ATTENTION_CONTEXTS:
        console.print(f"decode attention, {ATTENTION_ROWS} rows x {context} tokens ...")
        times = take_turns(attention_subjects(config, context, args.cold_mb * 2**20), args.repeats)
        kv_read = 2 * ATTENTION_ROWS * context * kv_heads * head_dim * 4  # each row's keys and values once
        row = {"rows": ATTENTION_ROWS, "context": context, "kv_bytes": kv_read, "samples_s": times}
        for subject, samples in times.items():
            median = statistics.median(samples)
            row[subject] = {"ms": 1000 * median, "kv_gb_s": kv_read / median / 1e9}
        results.append(row)
    return results


# (rows, new tokens a row, context a row): a cold prompt, and the agent loop's turns behind a cached history.
PREFILL_SHAPES = ((1, 512, 512), (4, 130, 2200))


def prefill_subjects(config, rows: int, new: int, context: int) -> dict[str, tuple]:
    """The prefill kernel and gather+SDPA on one pool: `rows` rows whose last `new` of `context` tokens
    are the chunk's queries, blocks scattered over the pool."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    block = EngineConfig().block_size
    per_row = math.ceil(context / block)
    k_cache, v_cache = torch.randn(2, rows * per_row, block, kv_heads, head_dim)
    tables = torch.randperm(rows * per_row).view(rows, per_row)
    lens, news = torch.full((rows,), context), torch.full((rows,), new)
    q = torch.randn(rows * new, heads, head_dim)
    query_pos = torch.arange(context - new, context)[None, None, :, None]
    mask = (torch.arange(per_row * block)[None, None, None, :] <= query_pos).expand(rows, 1, new, -1)
    query_index = torch.arange(rows * new).view(rows, new)
    group = AttentionGroup(tables, lens, mask, query_index, torch.arange(rows * new), query_lens=news)
    scale = head_dim**-0.5

    def kernel(pool):
        return torch.ops.llmopt.paged_prefill_attention(q, pool[0], pool[1], tables, lens, news, scale, 0)

    def sdpa(pool):
        return attend_prefill(q, pool[0], pool[1], group, scale)

    torch.testing.assert_close(kernel((k_cache, v_cache)), sdpa((k_cache, v_cache)), rtol=1e-4, atol=1e-4)
    return {"kernel": (kernel, [(k_cache, v_cache)]), "gather+sdpa": (sdpa, [(k_cache, v_cache)])}


def measure_prefill(config, args: argparse.Namespace, console: Console) -> list[dict]:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    results = []
    for rows, new, context in PREFILL_SHAPES:
        console.print(f"prefill attention, {rows} rows x {new} new of {context} tokens ...")
        times = take_turns(prefill_subjects(config, rows, new, context), args.repeats)
        keys = rows * sum(context - new + i + 1 for i in range(new))  # (query, key) pairs, causal
        flops = 4 * keys * heads * head_dim  # q.k and the weighted value: 2 multiply-adds a dimension
        row = {"rows": rows, "new": new, "context": context, "flops": flops, "samples_s": times}
        for subject, samples in times.items():
            median = statistics.median(samples)
            row[subject] = {"ms": 1000 * median, "gflop_s": flops / median / 1e9}
        results.append(row)
    return results


def read_bandwidth_gbs() -> float:
    """The machine's read bandwidth for reference: best of 6 sums of a 1 GiB tensor."""
    data = torch.ones(2**28)
    best = min(seconds_per_call(lambda t: t.sum(), [data]) for _ in range(6))
    return data.numel() * 4 / best / 1e9


def linear_table(results: list[dict], load: MachineLoad, repeats: int) -> Table:
    one_row = {(r["linear"], "packed"): r["packed"]["ms"] for r in results if r["rows"] == 1}
    one_row.update({(r["linear"], "mkl"): r["mkl"]["ms"] for r in results if r["rows"] == 1})
    table = Table(title=load.title(f"dense linear, cold weights, median of {repeats} (subjects take turns)"))
    columns = (
        "linear",
        "rows",
        "packed ms",
        "GB/s",
        "GFLOP/s",
        "MKL ms",
        "GB/s",
        "GFLOP/s",
        "packed speed-up",
    )
    for col in (*columns, "packed vs 1 row", "MKL vs 1 row"):
        table.add_column(col, justify="right")
    for r in results:
        p, m = r["packed"], r["mkl"]
        base_p, base_m = one_row.get((r["linear"], "packed")), one_row.get((r["linear"], "mkl"))
        table.add_row(
            f"{r['linear']} {r['in']}->{r['out']}",
            str(r["rows"]),
            f"{p['ms']:.3f}",
            f"{p['weight_gb_s']:.1f}",
            f"{p['gflop_s']:.0f}",
            f"{m['ms']:.3f}",
            f"{m['weight_gb_s']:.1f}",
            f"{m['gflop_s']:.0f}",
            f"{m['ms'] / p['ms']:.2f}x",
            f"{p['ms'] / base_p:.2f}x" if base_p else "-",
            f"{m['ms'] / base_m:.2f}x" if base_m else "-",
        )
    return table


def step_table(results: list[dict], counts: dict[str, int], load: MachineLoad) -> tuple[Table, list[dict]]:
    """Every linear of one decode step (each layer's, times the layers, and the output layer) at each row
    count where all were measured: what a step's weight stream costs with more rows."""
    by_rows: dict[int, dict[str, dict]] = {}
    for r in results:
        by_rows.setdefault(r["rows"], {})[r["linear"]] = r
    totals = []
    for rows, linears in sorted(by_rows.items()):
        if set(linears) != set(counts):
            continue
        totals.append(
            {
                "rows": rows,
                "packed_ms": sum(counts[n] * linears[n]["packed"]["ms"] for n in counts),
                "mkl_ms": sum(counts[n] * linears[n]["mkl"]["ms"] for n in counts),
            }
        )
    table = Table(title=load.title("all linears of one decode step (layers x 4 + the output layer)"))
    for col in ("rows", "packed ms", "packed vs 1 row", "MKL ms", "MKL vs 1 row", "packed speed-up"):
        table.add_column(col, justify="right")
    base = totals[0] if totals and totals[0]["rows"] == 1 else None
    for t in totals:
        table.add_row(
            str(t["rows"]),
            f"{t['packed_ms']:.1f}",
            f"{t['packed_ms'] / base['packed_ms']:.2f}x" if base else "-",
            f"{t['mkl_ms']:.1f}",
            f"{t['mkl_ms'] / base['mkl_ms']:.2f}x" if base else "-",
            f"{t['mkl_ms'] / t['packed_ms']:.2f}x",
        )
    return table, totals


def bf16_table(results: list[dict], load: MachineLoad) -> Table:
    table = Table(title=load.title("bf16 torch.mm against fp32 torch.mm (MKL, weights stored in x out)"))
    for col in ("linear", "rows", "fp32 ms", "bf16 ms", "bf16 speed-up"):
        table.add_column(col, justify="right")
    for r in results:
        if "mkl bf16" in r:
            fp32, bf16 = r["mkl"]["ms"], r["mkl bf16"]["ms"]
            table.add_row(
                f"{r['linear']} {r['in']}->{r['out']}",
                str(r["rows"]),
                f"{fp32:.3f}",
                f"{bf16:.3f}",
                f"{fp32 / bf16:.2f}x",
            )
    return table


def kernel_vs_fallback_table(
    title: str, shape_column: str, rate: tuple[str, str], ms_digits: int, rows: list[tuple[str, dict]]
) -> Table:
    """A kernel against gather+SDPA: per shape, each side's ms and `rate` (its label and its key in a
    side's figures), and the speed-up."""
    label, key = rate
    table = Table(title=title)
    for col in (
        shape_column,
        "kernel ms",
        f"kernel {label}",
        "gather+SDPA ms",
        f"gather+SDPA {label}",
        "speed-up",
    ):
        table.add_column(col, justify="right")
    for shape, r in rows:
        k, s = r["kernel"], r["gather+sdpa"]
        table.add_row(
            shape,
            f"{k['ms']:.{ms_digits}f}",
            f"{k[key]:.1f}",
            f"{s['ms']:.{ms_digits}f}",
            f"{s[key]:.1f}",
            f"{s['ms'] / k['ms']:.2f}x",
        )
    return table


def attention_table(results: list[dict], load: MachineLoad, repeats: int) -> Table:
    title = load.title(f"decode attention, cold KV, median of {repeats} (subjects take turns)")
    rows = [(f"{r['rows']} x {r['context']}", r) for r in results]
    return kernel_vs_fallback_table(title, "rows x context", ("GB/s", "kv_gb_s"), 3, rows)


def prefill_table(results: list[dict], load: MachineLoad, repeats: int) -> Table:
    title = load.title(f"prefill attention, median of {repeats} (subjects take turns)")
    rows = [(f"{r['rows']} x {r['new']} / {r['context']}", r) for r in results]
    return kernel_vs_fallback_table(title, "rows x new / context", ("GFLOP/s", "gflop_s"), 2, rows)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="passes per subject; the median is kept")
    ap.add_argument("--cold-mb", type=int, default=256, help="copies of each weight / cache, in MiB")
    ap.add_argument("--rows", default="1,4,16,64,512", help="row counts of the linear measurements")
    ap.add_argument("--only", default="linear,attention,prefill", help="a subset of linear,attention,prefill")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2: the subjects take turns")
    args.rows = [int(r) for r in args.rows.split(",")]
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    if not kernels.load():
        raise SystemExit("the compiled kernels did not build here (no C++ compiler?): nothing to measure")
    torch.manual_seed(0)
    shapes, counts, config = model_shapes()
    out: dict = {"args": vars(args), "threads": torch.get_num_threads(), "cold_bytes": args.cold_mb * 2**20}
    with torch.inference_mode():
        out["read_bandwidth_gbs"] = read_bandwidth_gbs()
        if "linear" in args.only:
            out["linear"] = measure_linears(shapes, args.rows, args, console)
        if "attention" in args.only:
            out["attention"] = measure_attention(config, args, console)
        if "prefill" in args.only:
            out["prefill_attention"] = measure_prefill(config, args, console)
    console.print(f"read bandwidth (best of 6 sums of 1 GiB): {out['read_bandwidth_gbs']:.1f} GB/s")
    tables: list[Table] = []
    if "linear" in out:
        tables.append(linear_table(out["linear"], load, args.repeats))
        table, out["decode_step_linears"] = step_table(out["linear"], counts, load)
        tables += [table, bf16_table(out["linear"], load)]
    if "attention" in out:
        tables.append(attention_table(out["attention"], load, args.repeats))
    if "prefill_attention" in out:
        tables.append(prefill_table(out["prefill_attention"], load, args.repeats))
    for table in tables:
        console.print(table)
    write_result("kernels", {**out, **load.finish(console)}, tables)


if __name__ == "__main__":
    main()
