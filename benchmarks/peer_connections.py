"""No request lost to a server's connection policy (issue #36): `llmopt bench`'s client, keep-alive on as
real clients have it, against `llmopt serve` (no flags), llama.cpp's server (which closes kept-alive
connections) and vLLM-CPU, one server at a time, at --concurrency 1, 4 and 16 with --requests requests a
point (fresh 64-token prompts per point, the same for every server,
16 tokens out). Prints per point the failed requests and the reconnects
(requests sent again on a fresh connection after the server had closed the pooled one, before any byte
of their answer). Goal: 0 failed everywhere. Refuses a busy machine unless --allow-busy.
Writes results/peer_connections.json.

    .venv/bin/python benchmarks/peer_connections.py [--requests 200] [--concurrency 1,4,16]
"""

from __future__ import annotations

import argparse
import asyncio

from harness import CorpusCursor, MachineLoad, ServeSubject, peer_installed
from rich.console import Console
from rich.table import Table

from llmopt.bench import LoadPoint, LocalServer, Target, run_point, summarize
from llmopt.checkpoints import load_tokenizer, resolve_model
from results import write_result

SUBJECTS = {"llmopt": ("llmopt (no flags)", []), "llama.cpp": ("llama.cpp", ["--engine", "llama.cpp"])}
SUBJECTS["vllm"] = ("vLLM-CPU", ["--engine", "vllm"])


def measure(subject: ServeSubject, points: dict[int, list], console: Console) -> dict[str, dict]:
    out = {}
    with LocalServer(subject.command, ready_timeout_s=600) as local:
        target = Target(endpoint=local.url + "/v1", model=subject.served_name, api="completions")
        for concurrency, requests in points.items():
            point = LoadPoint(concurrency=concurrency, num_requests=len(requests))
            result = asyncio.run(run_point(target, requests, point))
            summary = summarize(result.records, result.wall_s)
            out[str(concurrency)] = {k: summary[k] for k in ("requests", "failed", "reconnects", "errors")}
            out[str(concurrency)]["output_throughput"] = summary["output_throughput"]
            console.print(
                f"  c={concurrency}: {summary['failed']} failed, {summary['reconnects']} reconnects, "
                f"{summary['output_throughput']:.0f} tok/s"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--subjects", default=",".join(SUBJECTS))
    ap.add_argument("--allow-busy", action="store_true")
    args = ap.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    console = Console(width=140)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    cursor = CorpusCursor(load_tokenizer(resolve_model()))
    common = ["--max-num-seqs", "16", "--max-model-len", "1024"]
    names = [n for n in args.subjects.split(",") if n == "llmopt" or peer_installed(n)]
    # The same prompts for every server (each from a fresh process: nothing cached), fresh per point.
    points = {c: cursor.requests(args.requests, 64, 16) for c in concurrencies}
    results = {}
    for name in names:
        label, extra = SUBJECTS[name]
        console.print(f"{label} ...")
        results[label] = measure(ServeSubject(label, [*extra, *common]), points, console)
    table = Table(title=load.title(f"{args.requests} requests a point, keep-alive on, 64 in / 16 out"))
    for column in ("server", "concurrency", "requests", "failed", "reconnects", "out tok/s"):
        table.add_column(column, justify="left" if column == "server" else "right")
    for label, by_point in results.items():
        for concurrency, row in by_point.items():
            table.add_row(
                label,
                concurrency,
                str(row["requests"]),
                str(row["failed"]),
                str(row["reconnects"]),
                f"{row['output_throughput']:.0f}",
            )
    console.print(table)
    path = write_result(
        "peer_connections", {"args": vars(args), "results": results, **load.finish(console)}, [table]
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
