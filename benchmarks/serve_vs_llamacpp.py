"""`llmopt serve` against llama.cpp's own server on the same weights, one server at a time (llama.cpp's
threads spin, so the two never run together), driven by llmopt's bench client with the same streamed
chat requests. llama.cpp runs twice: on the bundled Q4_1 GGUF (what its users run) and on an F32 copy of
it (exactly the fp32 weights llmopt serves). Prints a table, writes results/serve_vs_llamacpp.json.

    python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp     # once
    .venv/bin/python benchmarks/serve_vs_llamacpp.py [--concurrency 1,4,16] [--rounds 2]
        [--quantized results/quantized/gptq]   # also serve a 4-bit checkpoint from `llmopt quantize`

Fairness: the servers take turns over --rounds rounds (each round starts them in a different order, each
from a fresh process); within a round every server gets the same requests, and every point and the
warm-up have prompts of their own, cut from text no other prompt of the run used, so no point is served
from a cache an earlier point or the warm-up filled. Each point keeps the round with the highest output
tok/s (its latencies come from that round) and shows the other rounds' spread. The run refuses to start
when the 1-minute load average is above 0.5 (another job would be measured too), unless --allow-busy.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from gguf_f32 import write_f32_copy
from harness import CorpusCursor, MachineLoad, rotated, spread, tail_latency
from rich.console import Console
from rich.table import Table

from llmopt.bench.client import BenchRequest, RequestRecord, Target
from llmopt.bench.launcher import LocalServer, llmopt_serve_command
from llmopt.bench.metrics import summarize
from llmopt.bench.runner import LoadPoint, run_point
from llmopt.checkpoints import bundled_gguf_path, load_tokenizer, resolve_model
from llmopt.engines.llama_cpp import llama_cpp_command
from llmopt.engines.options import ServeOptions
from results import RESULTS, write_result

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".peer-venv" / "bin" / "python"
WARMUP_REQUESTS = 2


class ConnectionPerRequest(Target):
    """A target whose every request asks for a connection of its own (`Connection: close`).

    llama.cpp's server (xllamacpp 2026.10) may drop a kept-alive connection after a streamed answer
    without saying so; the bench client then sends the next request on it, and that request fails
    ("Can not write request body"; it is never re-sent). A new loopback connection costs well under a
    millisecond against answers of hundreds, and every server gets the same treatment."""

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "Connection": "close"}


def point_summary(records: list[RequestRecord], wall_s: float) -> dict:
    summary = summarize(records, wall_s)
    summary["ttft_tail"] = tail_latency([r.ttft for r in records if r.success and r.ttft is not None])
    return summary


def measure(
    server_command,
    name: str,
    prompts: dict,
    console: Console,
) -> dict[int, dict]:
    """One server from a fresh process: the warm-up, then every concurrency point on its own prompts."""
    rows = {}
    with LocalServer(server_command, ready_timeout_s=300) as server:
        target = ConnectionPerRequest(endpoint=server.url + "/v1", model=name, api="chat")
        warm = prompts["warmup"]
        warmup = asyncio.run(run_point(target, warm, LoadPoint(concurrency=1, num_requests=len(warm))))
        if failed := [r.error for r in warmup.records if not r.success]:
            console.print(f"  [red]{name} warm-up: {len(failed)} failed[/red] {failed[:1]}")
        for c, requests in prompts["points"].items():
            result = asyncio.run(
                run_point(target, requests, LoadPoint(concurrency=c, num_requests=len(requests)))
            )
            summary = point_summary(result.records, result.wall_s)
            if summary["failed"]:  # reported, not fatal: one flaky point should not void the run
                console.print(
                    f"  [red]{name} c={c}: {summary['failed']} failed[/red] {summary['errors'][:1]}"
                )
            rows[c] = summary
            console.print(
                f"  c={c}: {summary['output_throughput']:.1f} tok/s, "
                f"TTFT p50 {summary['ttft_ms']['median']:.0f} ms ({summary['successful']} requests)"
            )
    return rows


def round_prompts(
    cursor: CorpusCursor, concurrencies: list[int], args: argparse.Namespace
) -> dict[str, list[BenchRequest] | dict[int, list[BenchRequest]]]:
    """One round's requests: the warm-up's and each point's, all cut from unused text."""
    return {
        "warmup": cursor.requests(WARMUP_REQUESTS, args.prompt_len, args.output_len),
        "points": {
            c: cursor.requests(requests_per_point(c, args), args.prompt_len, args.output_len)
            for c in concurrencies
        },
    }


def requests_per_point(concurrency: int, args: argparse.Namespace) -> int:
    # Enough requests for the percentiles shown, whatever the concurrency (4 at concurrency 1 made the
    # "p99" a maximum); more at high concurrency so the batch stays full for most of the point.
    return max(args.min_requests, args.requests_per_point * concurrency)


def servers(args: argparse.Namespace, slots: int, console: Console) -> dict[str, tuple]:
    """label -> (command builder, served model name)."""
    q4 = bundled_gguf_path()
    console.print("F32 copy of the GGUF (once) ...")
    f32 = write_f32_copy(q4, RESULTS / "peer-models" / "SmolLM2-135M-Instruct.F32.gguf")

    def peer(gguf: Path):
        # `llmopt serve --engine llama.cpp`'s translation: slots x context per slot, served as "peer".
        slot_len = args.prompt_len + args.output_len + 256
        options = ServeOptions(str(gguf), max_num_seqs=slots, max_model_len=slot_len)
        options.served_model_name = "peer"
        python = str(args.peer_python)
        return lambda port: llama_cpp_command(dataclasses.replace(options, port=port), python).argv

    return {
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


def keep_best(rounds: list[dict[int, dict]]) -> dict[int, dict]:
    """Per point, the round with the highest output tok/s, with every round's tok/s beside it."""
    kept = {}
    for c in rounds[0]:
        runs = [r[c] for r in rounds]
        best = max(runs, key=lambda s: s["output_throughput"])
        kept[c] = {**best, "all_output_throughput": [s["output_throughput"] for s in runs]}
    return kept


def print_table(
    results: dict[str, dict[int, dict]],
    concurrencies: list[int],
    args: argparse.Namespace,
    load: MachineLoad,
    console: Console,
) -> None:
    title = (
        f"streamed chat, prompt {args.prompt_len} tokens, output {args.output_len} tokens; best of "
        f"{args.rounds} rounds (servers take turns; latencies from the kept round)"
    )
    table = Table(title=load.title(title), caption=load.busy)
    columns = (
        "concurrency",
        "server",
        "requests",
        "output tok/s",
        "rounds min-max",
        "TTFT p50 ms",
        "TTFT tail ms",
        "ITL p50 ms",
        "cached tok",
        "÷ llama.cpp F32",
        "÷ llama.cpp Q4_1",
    )
    for col in columns:
        table.add_column(col, justify="right")
    for c in concurrencies:
        f32_tok_s = results["llama.cpp F32"][c]["output_throughput"]
        q4_tok_s = results["llama.cpp Q4_1"][c]["output_throughput"]
        for label, rows in results.items():
            s = rows[c]
            tail = s["ttft_tail"]
            table.add_row(
                str(c),
                label,
                str(s["successful"]),
                f"{s['output_throughput']:.1f}",
                spread(s["all_output_throughput"]),
                f"{s['ttft_ms']['median']:.0f}",
                "-" if tail["ms"] is None else f"{tail['ms']:.0f} ({tail['stat']})",
                f"{s['itl_ms']['median']:.1f}",
                str(s["cached_tokens"]),
                f"{s['output_throughput'] / f32_tok_s:.2f}x",
                f"{s['output_throughput'] / q4_tok_s:.2f}x",
            )
    console.print(table)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--requests-per-point", type=int, default=2, help="requests per point: this x concurrency"
    )
    ap.add_argument("--min-requests", type=int, default=20, help="but at least this many per point")
    ap.add_argument("--rounds", type=int, default=2, help="rounds in which the servers take turns")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--quantized", type=Path, action="append", default=[], help="llmopt checkpoints to add")
    ap.add_argument("--peer-python", type=Path, default=PEER_PYTHON, help="a Python with xllamacpp installed")
    ap.add_argument(
        "--allow-busy",
        action="store_true",
        help="run on a busy machine; the output is marked as not a result",
    )
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: the servers take turns over rounds")
    if args.min_requests < 1 or args.requests_per_point < 1:
        ap.error("--min-requests and --requests-per-point must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    if not args.peer_python.exists():
        raise SystemExit(
            f"llama.cpp's peer is not installed ({args.peer_python}): "
            "python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp"
        )
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    slots = max(concurrencies)
    cursor = CorpusCursor(load_tokenizer(resolve_model()))
    plan = servers(args, slots, console)
    rounds: dict[str, list[dict[int, dict]]] = {label: [] for label in plan}
    for round_index in range(args.rounds):
        prompts = round_prompts(cursor, concurrencies, args)  # the same for every server of the round
        for label in rotated(list(plan), round_index):
            console.print(f"[{round_index + 1}/{args.rounds}] {label} ...")
            command, model_name = plan[label]
            rounds[label].append(measure(command, model_name, prompts, console))
    results = {label: keep_best(runs) for label, runs in rounds.items()}

    print_table(results, concurrencies, args, load, console)
    out = {
        "args": vars(args),
        "kept": "per point, the round with the highest output tok/s; all_output_throughput lists every round",
        "results": {k: {str(c): v for c, v in r.items()} for k, r in results.items()},
        "rounds": {k: [{str(c): v for c, v in r.items()} for r in runs] for k, runs in rounds.items()},
    }
    write_result("serve_vs_llamacpp", {**out, **load.finish(console)})  # writes Paths as text


if __name__ == "__main__":
    main()
