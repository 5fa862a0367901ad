"""`llmopt serve` against llama.cpp's own server on the same weights, one server at a time (llama.cpp's
threads spin, so the two never run together), driven by llmopt's bench client with the same streamed
chat requests. llama.cpp runs twice: on the bundled Q4_1 GGUF (what its users run) and on an F32 copy of
it (exactly the fp32 weights llmopt serves). Prints a table, writes results/serve_vs_llamacpp.json.

    python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp     # once
    .venv/bin/python benchmarks/serve_vs_llamacpp.py [--concurrency 1,4,16] [--requests-per-point 2x]
        [--quantized results/quantized/gptq]   # also serve a 4-bit checkpoint from `llmopt quantize`
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llmopt.bench.client import Target
from llmopt.bench.launcher import LocalServer, llmopt_serve_command
from llmopt.bench.metrics import summarize
from llmopt.bench.runner import LoadPoint, run_point
from llmopt.bench.workload import random_prompts
from llmopt.checkpoints import bundled_gguf_path, load_tokenizer, resolve_model
from results import RESULTS, write_result

ROOT = Path(__file__).resolve().parent.parent
PEER_SCRIPT = Path(__file__).with_name("llama_server.py")
PEER_PYTHON = ROOT / ".peer-venv" / "bin" / "python"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_f32 import write_f32_copy  # noqa: E402


def measure(
    server_command, name: str, concurrencies: list[int], prompts, per_point: int, console: Console
) -> dict:
    rows = {}
    with LocalServer(server_command, ready_timeout_s=300) as server:
        target = Target(endpoint=server.url + "/v1", model=name, api="chat")
        asyncio.run(run_point(target, prompts[:2], LoadPoint(concurrency=1, num_requests=2)))  # warm-up
        for c in concurrencies:
            point = LoadPoint(concurrency=c, num_requests=max(4, per_point * c))
            result = asyncio.run(run_point(target, prompts, point))
            summary = summarize(result.records, result.wall_s)
            if summary["failed"]:  # reported, not fatal: one flaky point should not void the run
                console.print(
                    f"  [red]{name} c={c}: {summary['failed']} failed[/red] {summary['errors'][:1]}"
                )
            rows[c] = summary
            console.print(
                f"  {name} c={c}: {summary['output_throughput']:.1f} tok/s, "
                f"TTFT p50 {summary['ttft_ms']['median']:.0f} ms"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--requests-per-point", type=int, default=2, help="requests per point = this x concurrency"
    )
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--quantized", type=Path, action="append", default=[], help="llmopt checkpoints to add")
    args = ap.parse_args()
    console = Console(width=150)
    if not PEER_PYTHON.exists():
        raise SystemExit(
            "llama.cpp's peer is not installed: "
            "python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp"
        )
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    slots = max(concurrencies)
    tokenizer = load_tokenizer(resolve_model())
    prompts = random_prompts(tokenizer, 64, args.prompt_len, args.output_len, seed=1)
    q4 = bundled_gguf_path()
    f32 = write_f32_copy(q4, RESULTS / "peer-models" / "SmolLM2-135M-Instruct.F32.gguf")

    def peer(gguf: Path):
        ctx = slots * (args.prompt_len + args.output_len + 256)
        return lambda port: [
            str(PEER_PYTHON),
            str(PEER_SCRIPT),
            "--model",
            str(gguf),
            "--port",
            str(port),
            "--np",
            str(slots),
            "--ctx",
            str(ctx),
            "--threads",
            "2",
            "--alias",
            "peer",
        ]

    servers = {
        "llmopt fp32": (
            lambda port: llmopt_serve_command(port, ["--max-num-seqs", str(slots)]),
            "smollm2-135m",
        ),
        **{
            f"llmopt {path.name}": (
                lambda port, path=path: llmopt_serve_command(port, [str(path), "--max-num-seqs", str(slots)]),
                str(path),  # the served model name defaults to the model argument
            )
            for path in args.quantized
        },
        "llama.cpp F32": (peer(f32), "peer"),
        "llama.cpp Q4_1": (peer(q4), "peer"),
    }
    results = {}
    for label, (command, model_name) in servers.items():
        console.print(f"{label} ...")
        results[label] = measure(
            command, model_name, concurrencies, prompts, args.requests_per_point, console
        )

    table = Table(title=f"streamed chat, prompt {args.prompt_len} tokens, output {args.output_len} tokens")
    for col in (
        "concurrency",
        "server",
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "÷ llama.cpp F32",
        "÷ llama.cpp Q4_1",
    ):
        table.add_column(col, justify="right")
    for c in concurrencies:
        f32_tok_s = results["llama.cpp F32"][c]["output_throughput"]
        q4_tok_s = results["llama.cpp Q4_1"][c]["output_throughput"]
        for label in servers:
            s = results[label][c]
            table.add_row(
                str(c),
                label,
                f"{s['output_throughput']:.1f}",
                f"{s['ttft_ms']['median']:.0f}",
                f"{s['ttft_ms']['p99']:.0f}",
                f"{s['itl_ms']['median']:.1f}",
                f"{s['output_throughput'] / f32_tok_s:.2f}x",
                f"{s['output_throughput'] / q4_tok_s:.2f}x",
            )
    console.print(table)
    out = {
        "args": vars(args),
        "results": {k: {str(c): v for c, v in r.items()} for k, r in results.items()},
    }
    write_result("serve_vs_llamacpp", out)  # writes Paths (--quantized) as text


if __name__ == "__main__":
    main()
