"""Decode speed of a random mixture-of-experts model in llmopt against the same model run through
transformers, at batch 1 and batch 8: what grouping the step's tokens by expert buys (each chosen expert's
weights read once per step, for all its rows). Prints a table and writes results/moe.json.

    .venv/bin/python benchmarks/moe.py [--family mixtral|qwen3_moe] [--batches 1,8] [--repeats 3]
    .venv/bin/python benchmarks/moe.py --quick      # a smoke run, tiny sizes, not a result

The model is seeded random weights (no small real MoE checkpoint exists offline) with the bundled
model's tokenizer and a cut vocabulary, so that the experts, not the output layer, are most of what a
decode step reads. Decode tok/s = batch x (output tokens - 1) / the time after the first token; both
subjects take turns over rounds and the best round of each is kept. Read the ratio, not the figures.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch
from harness import MachineLoad, rotated, spread
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.checkpoints import reference_folder
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from results import write_result

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SIZES = {  # hidden, expert intermediate, layers, experts, heads, kv heads, vocab
    "full": dict(hidden=512, intermediate=1024, layers=4, experts=8, heads=8, kv_heads=2, vocab=8192),
    "quick": dict(hidden=128, intermediate=256, layers=2, experts=4, heads=2, kv_heads=1, vocab=2048),
}


def build_model(family: str, size: dict, folder: Path) -> dict:
    """Save a seeded random MoE (top-2 routing) with the bundled tokenizer; return its config as a dict."""
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    common = dict(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        num_experts_per_tok=2,
        max_position_embeddings=2048,
    )
    if family == "mixtral":
        config = MixtralConfig(
            intermediate_size=size["intermediate"], num_local_experts=size["experts"], **common
        )
    else:
        config = Qwen3MoeConfig(
            moe_intermediate_size=size["intermediate"],
            intermediate_size=size["intermediate"],
            num_experts=size["experts"],
            head_dim=size["hidden"] // size["heads"],
            norm_topk_prob=True,
            **common,
        )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    bundled = reference_folder()
    for name in TOKENIZER_FILES:
        if (bundled / name).is_file():
            shutil.copy(bundled / name, folder / name)
    return config.to_dict()


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (batch, length), generator=gen).tolist()


def llmopt_decode(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> float:
    """Decode tok/s of the batch: every prompt is prefilled in the first step, then all decode together."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    first = None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if first is None and outputs:
            first = time.perf_counter()
    return len(prompts) * (output_len - 1) / (time.perf_counter() - first)


def transformers_decode(model, prompts: list[list[int]], output_len: int) -> float:
    """Decode tok/s of transformers' own forward with its KV cache, greedy, timed after the prefill (a
    bare loop: no generate() overhead in the figure)."""
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        start = time.perf_counter()
        for _ in range(output_len - 1):
            next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(next_ids, past_key_values=out.past_key_values, use_cache=True)
    return len(prompts) * (output_len - 1) / (time.perf_counter() - start)


def rounds(
    folder: Path, vocab: int, args: argparse.Namespace, console: Console
) -> tuple[dict[str, list[float]], str]:
    """Decode tok/s of every round of each subject, and the expert kernel transformers ran with."""
    from transformers import AutoModelForCausalLM

    engine = LLMEngine(EngineConfig(model=str(folder), max_num_seqs=max(args.batches), num_kv_blocks=256))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    subjects = [f"{who} batch={b}" for b in args.batches for who in ("llmopt", "transformers")]
    runs: dict[str, list[float]] = {name: [] for name in subjects}
    warm = prompts_for(1, args.prompt_len, vocab, seed=99)
    llmopt_decode(engine, warm, 4), transformers_decode(reference, warm, 4)  # warm-up
    for r in range(args.repeats):
        for name in rotated(subjects, r):
            who, batch = name.split(" batch=")
            # Fresh prompts per round and subject: llmopt's prefix cache finds nothing of an earlier run.
            prompts = prompts_for(int(batch), args.prompt_len, vocab, seed=1000 * r + subjects.index(name))
            run = llmopt_decode if who == "llmopt" else transformers_decode
            runs[name].append(run(engine if who == "llmopt" else reference, prompts, args.output_len))
            console.print(f"[{r + 1}/{args.repeats}] {name}: {runs[name][-1]:.1f} decode tok/s")
    return runs, str(getattr(reference.config, "_experts_implementation", None))


def print_table(
    runs: dict[str, list[float]], args: argparse.Namespace, load: MachineLoad, console: Console
) -> tuple[Table, dict]:
    table = Table(title=load.title(f"random {args.family} MoE: decode tok/s, best of {args.repeats} rounds"))
    for col in ("batch", "llmopt", "rounds", "transformers", "rounds", "llmopt / transformers"):
        table.add_column(col, justify="right")
    ratios = {}
    for b in args.batches:
        ours, theirs = runs[f"llmopt batch={b}"], runs[f"transformers batch={b}"]
        ratios[b] = max(ours) / max(theirs)
        table.add_row(
            str(b),
            f"{max(ours):.1f}",
            spread(ours),
            f"{max(theirs):.1f}",
            spread(theirs),
            f"{ratios[b]:.2f}x",
        )
    console.print(table)
    return table, ratios


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("mixtral", "qwen3_moe"), default="mixtral")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds in which the subjects take turns")
    ap.add_argument("--quick", action="store_true", help="tiny model and lengths: a smoke run, not a result")
    args = ap.parse_args()
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, not {args.batches!r}")
    if args.quick:
        args.output_len, args.prompt_len, args.repeats = 8, 16, 2
    if args.repeats < 2 or args.output_len < 2 or min(args.batches) < 1:
        ap.error("--repeats and --output-len must be at least 2, every batch at least 1")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    size = SIZES["quick" if args.quick else "full"]
    with tempfile.TemporaryDirectory(prefix="llmopt-moe-") as tmp:
        config = build_model(args.family, size, Path(tmp))
        runs, experts_impl = rounds(Path(tmp), size["vocab"], args, console)
    table, ratios = print_table(runs, args, load, console)
    scaling = None
    if len(args.batches) > 1:
        lo, hi = min(args.batches), max(args.batches)
        scaling = {
            who: max(runs[f"{who} batch={hi}"]) / max(runs[f"{who} batch={lo}"])
            for who in ("llmopt", "transformers")
        }
        console.print(
            f"batch {hi} over batch {lo}: llmopt {scaling['llmopt']:.2f}x, "
            f"transformers {scaling['transformers']:.2f}x"
        )
    summary = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "args": vars(args),
        "quick": args.quick,
        "model": {"size": size, "config": {k: config.get(k) for k in ("model_type", "num_experts_per_tok")}},
        "transformers_experts_implementation": experts_impl,
        "decode_tok_s": runs,
        "batch_scaling": scaling,
        "best_ratio_llmopt_over_transformers": ratios,
    }
    write_result("moe_quick" if args.quick else "moe", {**summary, **load.finish(console)}, [table])


if __name__ == "__main__":
    main()
