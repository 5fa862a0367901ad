"""Engine throughput against transformers `generate`, batch-1 decode against the memory-bandwidth limit,
and prefix caching's effect on time to first token. Prints a table and writes results/engine_throughput.json.

    .venv/bin/python benchmarks/engine_throughput.py [--requests 64] [--prompt-len 128] [--output-len 128]
        [--concurrency 1,4,16] [--repeats 2] [--prefix-turns 5]

Both sides are warmed up first, on prompts no run reuses. Throughput runs keep prefix caching on (the
engine's default, as `llmopt serve` runs) and give every point of every round prompts of their own,
cut from text no earlier prompt used: no run is served from an earlier one's cache, and the table counts
the prompt tokens that came from the cache anyway. Prefix caching itself is measured only in its own
section, on and off, with a fresh shared prefix every turn.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from harness import CorpusCursor, MachineLoad, rotated, spread
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.checkpoints import reference_folder
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from results import write_result


def run_engine(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> dict:
    """Submit every prompt at once; the engine's max_num_seqs is the concurrency."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    cached = 0
    start = time.perf_counter()
    for p in prompts:
        rid = engine.add_request(p, params)
        sent[rid] = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter()
            first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = now
                cached += out.cached_tokens
    wall = time.perf_counter() - start
    tpot = [(done[r] - first[r]) / max(1, output_len - 1) for r in sent]
    return {
        "output_tok_s": len(prompts) * output_len / wall,
        "wall_s": wall,
        "mean_tpot_ms": 1000 * sum(tpot) / len(tpot),
        "decode_tok_s_per_seq": 1 / (sum(tpot) / len(tpot)),
        "cached_prompt_tokens": cached,
    }


def load_transformers(model_dir: Path, warmup: list[list[int]]):
    """transformers' model, loaded once and warmed up as the engine is (its first generate pays lazy
    set-up that no later one does), on prompts no run reuses."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    run_transformers(model, warmup, 8, len(warmup))
    return model


def run_transformers(model, prompts: list[list[int]], output_len: int, batch: int) -> dict:
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i : i + batch])  # equal lengths: no padding needed
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=output_len,
                min_new_tokens=output_len,
            )
            assert out.shape[1] == ids.shape[1] + output_len
    wall = time.perf_counter() - start
    return {"output_tok_s": len(prompts) * output_len / wall, "wall_s": wall}


def read_bandwidth_gbs() -> float:
    """Best of several full reads of a 1 GiB tensor (far larger than any cache)."""
    data = torch.ones(2**28)
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def bytes_per_decode_token(engine: LLMEngine) -> int:
    """Weights every decode step reads: everything but the embedding table (one row is read)."""
    model = engine.runner.model
    total = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if name != "embed")
    return total


def prefix_cache_ttft(model_dir: Path, cursor: CorpusCursor, args: argparse.Namespace) -> dict:
    """Median TTFT, caching off and on, of a prompt whose first `prefix_shared` tokens an earlier request
    already sent. Every turn cuts a new earlier prompt and a new tail from unused text, so a turn finds
    in the cache only what its own earlier request put there; the two engines take turns, alternating
    which goes first."""
    engines = {
        caching: LLMEngine(
            EngineConfig(model=str(model_dir), enable_prefix_caching=caching, num_kv_blocks=256)
        )
        for caching in (False, True)
    }
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    def finish(engine: LLMEngine) -> None:
        while engine.has_unfinished_requests():
            engine.step()

    for engine in engines.values():  # warm-up on text of its own
        engine.add_request(cursor.take(args.prefix_prompt_len), params)
        finish(engine)
    ttfts: dict[bool, list[float]] = {False: [], True: []}
    for turn in range(args.prefix_turns):
        earlier = cursor.take(args.prefix_prompt_len)
        tail = cursor.take(args.prefix_prompt_len - args.prefix_shared)
        for caching in rotated([False, True], turn):
            engine = engines[caching]
            engine.add_request(earlier, params)
            finish(engine)
            start = time.perf_counter()
            engine.add_request(earlier[: args.prefix_shared] + tail, params)
            finish(engine)
            ttfts[caching].append(time.perf_counter() - start)
    off, on = statistics.median(ttfts[False]), statistics.median(ttfts[True])
    return {
        "ttft_off_s": off,
        "ttft_on_s": on,
        "speedup": off / on,
        "turns_off_s": ttfts[False],
        "turns_on_s": ttfts[True],
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="rounds in which the configurations take turns")
    ap.add_argument("--prefix-turns", type=int, default=5, help="turns of the prefix-caching measurement")
    ap.add_argument("--prefix-prompt-len", type=int, default=1000)
    ap.add_argument("--prefix-shared", type=int, default=900, help="tokens shared with the earlier request")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2: the configurations take turns over rounds")
    if args.output_len < 2 or args.requests < 1 or args.prefix_turns < 1:
        ap.error("--output-len must be at least 2, --requests and --prefix-turns at least 1")
    if not 0 < args.prefix_shared < args.prefix_prompt_len:
        ap.error("--prefix-shared must be between 0 and --prefix-prompt-len")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args


def check_corpus(args: argparse.Namespace, cursor: CorpusCursor) -> None:
    """Stop before any work when the fresh prompts the run needs do not fit in the corpus."""
    runs = 1 + args.repeats * len(args.concurrency)  # the warm-up, then every engine point's rounds
    prefix = (2 + args.prefix_turns * 2) * args.prefix_prompt_len  # an upper bound
    needed = runs * args.requests * args.prompt_len + prefix
    if needed > cursor.remaining:
        raise SystemExit(
            f"this run needs {needed} tokens of fresh prompts and the corpus holds {cursor.remaining}: "
            "ask for fewer requests, repeats or shorter prompts"
        )


def throughput_rounds(
    engine: LLMEngine, hf_model, cursor: CorpusCursor, args: argparse.Namespace, console: Console
) -> dict[str, dict]:
    """Every configuration once per round, taking turns (a different one first each round), on prompts
    of its own; the fastest run of each is kept, with every run's tok/s beside it."""
    hf_name = f"transformers batch={args.hf_batch}"
    names = [f"llmopt c={c}" for c in args.concurrency] + [hf_name]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        prompts = {name: cursor.prompts(args.requests, args.prompt_len) for name in names[:-1]}
        # transformers keeps nothing between calls, so it can run on text llmopt also gets this round.
        prompts[hf_name] = prompts[names[0]]
        for name in rotated(names, repeat):
            console.print(f"[{repeat + 1}/{args.repeats}] {name} ...")
            if name == hf_name:
                runs[name].append(run_transformers(hf_model, prompts[name], args.output_len, args.hf_batch))
            else:
                engine.scheduler.max_num_seqs = int(name.split("=")[1])
                runs[name].append(run_engine(engine, prompts[name], args.output_len))
    rows = {}
    for name in names:
        best = max(runs[name], key=lambda r: r["output_tok_s"])
        rows[name] = {**best, "all_output_tok_s": [r["output_tok_s"] for r in runs[name]]}
        if name != hf_name:  # what every run of it, kept or not, took from the prefix cache
            rows[name]["all_cached_prompt_tokens"] = sum(r["cached_prompt_tokens"] for r in runs[name])
    return rows


def print_table(
    rows: dict[str, dict], args: argparse.Namespace, load: MachineLoad, console: Console
) -> Table:
    hf = rows[f"transformers batch={args.hf_batch}"]["output_tok_s"]
    table = Table(
        title=load.title(
            f"{args.requests} requests, prompt {args.prompt_len} tokens, output {args.output_len} tokens; "
            f"best of {args.repeats} rounds (configurations take turns)"
        )
    )
    for col in (
        "run",
        "output tok/s",
        "rounds min-max",
        "vs transformers",
        "mean TPOT ms",
        "cached tok, all rounds",
    ):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        table.add_row(
            name,
            f"{r['output_tok_s']:.1f}",
            spread(r["all_output_tok_s"]),
            f"{r['output_tok_s'] / hf:.2f}x",
            f"{r['mean_tpot_ms']:.1f}" if "mean_tpot_ms" in r else "-",
            str(r["all_cached_prompt_tokens"]) if "all_cached_prompt_tokens" in r else "-",
        )
    console.print(table)
    return table


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    model_dir = reference_folder()  # the fp32 engine beside transformers on the same weights
    engine = LLMEngine(EngineConfig(model=str(model_dir), max_num_seqs=max(args.concurrency)))
    cursor = CorpusCursor(engine.tokenizer)
    check_corpus(args, cursor)
    run_engine(engine, cursor.prompts(2, args.prompt_len), 8)  # warm-up, on prompts no run reuses
    hf_model = load_transformers(model_dir, cursor.prompts(2, args.prompt_len))
    rows = throughput_rounds(engine, hf_model, cursor, args, console)
    del hf_model
    bandwidth = read_bandwidth_gbs()
    model_bytes = bytes_per_decode_token(engine)
    del engine
    console.print("prefix caching ...")
    prefix = prefix_cache_ttft(model_dir, cursor, args)

    table = print_table(rows, args, load, console)
    cached = sum(r.get("all_cached_prompt_tokens", 0) for r in rows.values())
    console.print(
        "throughput runs: prefix caching on (the engine's default), fresh prompts for every point and "
        f"round: {cached} prompt tokens of all their runs came from the cache"
    )
    limit = bandwidth * 1e9 / model_bytes
    batch1 = rows.get("llmopt c=1", {}).get("decode_tok_s_per_seq")
    console.print(
        f"read bandwidth {bandwidth:.1f} GB/s, {model_bytes / 1e6:.0f} MB per decode step "
        f"-> limit {limit:.1f} tok/s; "
        + (f"batch-1 decode {batch1:.1f} tok/s = {100 * batch1 / limit:.0f}% of the limit" if batch1 else "")
    )
    console.print(
        f"prefix caching: median TTFT ({args.prefix_turns} turns each, fresh text every turn) of a "
        f"{args.prefix_prompt_len}-token prompt sharing {args.prefix_shared} tokens with an earlier request: "
        f"off {1000 * prefix['ttft_off_s']:.0f} ms, on {1000 * prefix['ttft_on_s']:.0f} ms "
        f"({prefix['speedup']:.1f}x)"
    )
    summary = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "args": vars(args),
        "throughput_prefix_caching": "on (engine default), fresh prompts for every point and round",
        "runs": rows,
        "read_bandwidth_gbs": bandwidth,
        "bytes_per_decode_token": model_bytes,
        "bandwidth_limit_tok_s": limit,
        "batch1_decode_tok_s": batch1,
        "batch1_fraction_of_limit": batch1 / limit if batch1 else None,
        "prefix_cache": prefix,
    }
    write_result("engine_throughput", {**summary, **load.finish(console)}, [table])


if __name__ == "__main__":
    main()
