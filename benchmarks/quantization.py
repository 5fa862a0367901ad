"""Quantization in one run: quantize the default model with INT8, GPTQ-4 and AWQ-4 (llm-compressor),
then measure each checkpoint and the fp32 baseline in our engine: size, perplexity on the held-out half
of the built-in corpus, batch-1 and batch-16 decode tok/s. Prints the table with ratios to fp32 and
writes results/quantization.json.

    .venv/bin/python benchmarks/quantization.py [--reuse] [--only int8,gptq]

Checkpoints go to results/quantized/<method>; --reuse measures existing ones without re-quantizing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llmopt.checkpoints import resolve_model
from llmopt.engine.llm import LLM
from llmopt.engine.sampling_params import SamplingParams
from llmopt.evaluate.perplexity import perplexity
from llmopt.quant.quantize import QuantizeConfig, quantize
from llmopt.quant.report import REPORT_FILE, checkpoint_size_mb, decode_speed
from results import RESULTS, write_result

METHODS = ("int8", "gptq", "awq")


def batch_decode_speed(model_dir: Path, batch: int = 16, tokens: int = 64) -> float:
    """Output tok/s of `batch` requests decoded together (short prompts, so decode dominates)."""
    llm = LLM(str(model_dir), num_kv_blocks=256)
    prompts = [f"Write a story about lighthouse number {i}." for i in range(batch)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reuse", action="store_true", help="measure existing checkpoints, do not re-quantize")
    ap.add_argument("--only", default=",".join(METHODS), help="comma-separated subset of int8,gptq,awq")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens")
    args = ap.parse_args()
    console = Console()
    checkpoints: dict[str, Path] = {"fp32": resolve_model()}
    seconds: dict[str, float | None] = {"fp32": None}
    for method in args.only.split(","):
        out = RESULTS / "quantized" / method
        if not (args.reuse and (out / REPORT_FILE).is_file()):
            console.print(f"quantizing with {method} ...")
            quantize(QuantizeConfig(model=None, out=out, method=method, eval_windows=1, overwrite=True))
        checkpoints[method] = out
        seconds[method] = json.loads((out / REPORT_FILE).read_text())["seconds"]

    rows = []
    for name, path in checkpoints.items():
        console.print(f"measuring {name} ...")
        rows.append(
            {
                "checkpoint": name,
                "quantize_s": seconds[name],
                "size_mb": checkpoint_size_mb(path),
                "perplexity": perplexity(str(path), None, 512, args.windows).perplexity,
                "decode_b1_tok_s": decode_speed(path, tokens=128),
                "decode_b16_tok_s": batch_decode_speed(path),
            }
        )
    base = rows[0]
    table = Table(title="Quantized checkpoints in llmopt's engine (ratios to fp32)")
    for col in ("checkpoint", "quantize s", "size MB", "perplexity", "batch-1 tok/s", "batch-16 tok/s"):
        table.add_column(col, justify="left" if col == "checkpoint" else "right")
    for r in rows:
        r["perplexity_change"] = r["perplexity"] / base["perplexity"] - 1
        r["b1_ratio"] = r["decode_b1_tok_s"] / base["decode_b1_tok_s"]
        r["b16_ratio"] = r["decode_b16_tok_s"] / base["decode_b16_tok_s"]
        table.add_row(
            r["checkpoint"],
            "-" if r["quantize_s"] is None else f"{r['quantize_s']:.0f}",
            f"{r['size_mb']:.0f}",
            f"{r['perplexity']:.3f} ({r['perplexity_change'] * 100:+.1f} %)",
            f"{r['decode_b1_tok_s']:.1f} ({r['b1_ratio']:.2f}x)",
            f"{r['decode_b16_tok_s']:.1f} ({r['b16_ratio']:.2f}x)",
        )
    console.print(table)
    write_result("quantization", {"args": vars(args), "results": rows})


if __name__ == "__main__":
    main()
