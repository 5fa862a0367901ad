"""A real model served as users serve it, llmopt against llama.cpp on the same GGUF (issue #51): plain
`llmopt serve FILE` (its default speculation: prompt lookup paced by measured cost), the same with
`--speculative-config off`, and llama.cpp's server (`llmopt serve FILE --engine llama.cpp`); each engine
also with the 0.5B Qwen2.5-Coder as draft model (same vocabulary): llmopt's `--speculative-config` with
method "draft", llama.cpp's `--draft`, 4 draft tokens a step for both. One server at a time, taking
turns, every round with fresh prompts, the same for every server within a round.

Per server and round, streamed chat with greedy sampling:
- one stream, prompts of 128 tokens, 64 out (TPOT: a request's time per output token after the first),
- one stream, code answers (a short coding task, 160 tokens out): what a coding assistant streams,
- 4 and 8 streams together (prompts of 128, 64 out): aggregate output tok/s,
- one prompt of 512 and one of 2,000 tokens alone: prefill tok/s (prompt tokens over TTFT).
The one-stream rows also show the share of the machine's read bandwidth the decode implies: the bytes
of weights a decode step reads (llmopt's /metrics `llmopt:decode_weight_bytes`; for llama.cpp the same
file's bytes less its embedding, which a step reads one row of) over the time per output token (TPOT), against
the measured bandwidth (llmopt/bench/observe/memory_bandwidth.py). Speculation rows say llmopt's acceptance
and tokens per verification step (its /metrics).

Default model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (`make real-models`). Refuses a busy machine (1-minute
load over 0.5) unless --allow-busy. Writes results/real_model.json.

    .venv/bin/python benchmarks/real_model.py [--rounds 2]
        [--subjects llmopt,llmopt-off,llmopt-draft,llama.cpp,llama.cpp-draft]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import httpx
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
from real_models import assemble
from rich.console import Console
from rich.table import Table

from llmopt.bench import (
    BenchRequest,
    LoadPoint,
    LocalServer,
    Target,
    parse_metrics,
    read_bandwidth_gbs,
    run_point,
)
from llmopt.checkpoints import load_tokenizer
from llmopt.gguf_file import read_gguf_file
from results import write_result

SUBJECTS = ("llmopt", "llmopt-off", "llmopt-draft", "llama.cpp", "llama.cpp-draft")
# Each speculating subject's baseline: the same server with no speculation. llmopt's default speculates
# (prompt lookup paced by measured cost), so its baseline is `--speculative-config off`.
WITHOUT_SPECULATION = {"llmopt": "llmopt-off", "llmopt-draft": "llmopt-off", "llama.cpp-draft": "llama.cpp"}
DRAFT_TOKENS = 4  # tokens drafted a step, for both servers (llama.cpp's --draft-max)
CODE_TASKS = [
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring.",
    "Write a Python class for an LRU cache with get and put, using OrderedDict.",
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests.",
    "Write a JavaScript function that debounces another function, with a short usage example.",
    "Write a Python function that computes the edit distance between two strings.",
    "Write a SQL query and a Python function that returns the top 5 customers by total order value.",
]


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[BenchRequest]
    concurrency: int


def subjects(names: list[str], model: Path, draft: Path) -> list[ServeSubject]:
    spec = json.dumps({"method": "draft", "model": str(draft), "num_speculative_tokens": DRAFT_TOKENS})
    args = {
        "llmopt": [str(model)],
        "llmopt-off": [str(model), "--speculative-config", "off"],
        "llmopt-draft": [str(model), "--speculative-config", spec],
        "llama.cpp": [str(model), "--engine", "llama.cpp"],
        "llama.cpp-draft": [str(model), "--engine", "llama.cpp", "--speculative-config", spec],
    }
    common = ["--max-num-seqs", "8", "--max-model-len", "4096"]
    chosen = [n for n in names if n.startswith("llmopt") or peer_installed("llama.cpp")]
    return [ServeSubject(n, [*args[n], *common]) for n in chosen]


def workloads(texts: list[BenchRequest], round_index: int) -> list[Workload]:
    """A round's fresh requests: chat prompts cut from the corpus, and three coding tasks no other round
    asks."""
    chat = [BenchRequest(messages=[{"role": "user", "content": r.prompt}], max_tokens=64) for r in texts]
    tasks = CODE_TASKS[3 * round_index : 3 * round_index + 3]
    code = [BenchRequest(messages=[{"role": "user", "content": t}], max_tokens=160) for t in tasks]
    return [
        Workload("1 stream", chat[:4], 1),
        Workload("1 stream, code", code, 1),
        Workload("4 streams", chat[4:12], 4),
        Workload("8 streams", chat[12:28], 8),
    ]


def measured(records) -> dict:
    ok = [r for r in records if r.success]
    # Time per output token after the first, each request's mean: what a stream decodes at. Not the
    # median gap between streamed chunks, which for a server that streams each verification's tokens
    # together (llama.cpp with a draft) is the gap within a burst, 0.1 ms.
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft and (r.output_tokens or 0) > 1]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    first, last = min(r.start for r in ok), max(r.start + r.e2e for r in ok)
    return {
        "tok_s": out_tokens / (last - first),
        "tpot_ms": statistics.median(tpot) * 1000 if tpot else None,
        "failed": len(records) - len(ok),
    }


def speculation(url: str) -> dict:
    """llmopt's accepted share of drafted tokens and tokens per verification, from /metrics."""
    m = parse_metrics(httpx.get(url + "/metrics").text)

    def counter(name: str) -> float | None:
        return m.get(f"llmopt:{name}_total", m.get(f"llmopt:{name}"))

    drafted, accepted = counter("spec_decode_num_draft_tokens"), counter("spec_decode_num_accepted_tokens")
    steps = counter("spec_decode_num_drafts")
    if not drafted or not steps:
        return {}
    return {"acceptance": accepted / drafted, "tokens_per_step": 1 + accepted / steps}


def run_subject(subject: ServeSubject, loads: list[Workload], prefill: dict[int, BenchRequest]) -> dict:
    result = {}
    with LocalServer(subject.command, ready_timeout_s=900) as local:
        target = Target(endpoint=local.url + "/v1", model=subject.served_name, connection_reuse=False)
        warm = BenchRequest(messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
        asyncio.run(run_point(target, [warm], LoadPoint(concurrency=1, num_requests=1)))
        for load in loads:
            point = LoadPoint(concurrency=load.concurrency, num_requests=len(load.requests))
            result[load.name] = measured(asyncio.run(run_point(target, load.requests, point)).records)
        for length, request in prefill.items():
            completion = Target(**{**target.__dict__, "api": "completions"})
            [record] = asyncio.run(
                run_point(completion, [request], LoadPoint(concurrency=1, num_requests=1))
            ).records
            result[f"prefill {length}"] = {
                "tok_s": record.prompt_tokens / record.ttft if record.ttft else 0.0
            }
        if subject.label.startswith("llmopt"):
            metrics = parse_metrics(httpx.get(local.url + "/metrics").text)
            result["decode_weight_bytes"] = metrics.get("llmopt:decode_weight_bytes")
            result["speculation"] = speculation(local.url)
    return result


def llama_cpp_decode_bytes(model: Path) -> int:
    """What a llama.cpp decode step reads of the file: every tensor but the embedding (one row a token)."""
    tensors = read_gguf_file(model).tensors.values()
    return sum(t.nbytes for t in tensors if t.name != "token_embd.weight")


def run_rounds(args: argparse.Namespace, console: Console) -> dict[str, list[dict]]:
    model, draft = assemble("qwen2.5-coder-1.5b"), assemble("qwen2.5-coder-0.5b")
    cursor = CorpusCursor(load_tokenizer(model))
    servers = subjects(args.subjects, model, draft)
    rows = Rows()
    for round_index in range(args.rounds):
        loads = workloads(cursor.requests(28, 128, 64), round_index)
        prefill = {n: cursor.requests(1, n, 1)[0] for n in (512, 2000)}
        for server in rotated(servers, round_index):
            console.print(f"[{round_index + 1}/{args.rounds}] {server.label} ...")
            result = run_subject(server, loads, prefill)
            rows.add(server.label, result)
            console.print(f"  {result}")
    for label in rows.rounds:
        for result in rows.rounds[label]:
            result.setdefault("decode_weight_bytes", llama_cpp_decode_bytes(model))
    return rows.rounds


def median(results: list[dict], load: str, key: str) -> float | None:
    values = [r[load][key] for r in results if r.get(load, {}).get(key) is not None]
    return statistics.median(values) if values else None


def table(rounds: dict[str, list[dict]], bandwidth: float, load: MachineLoad) -> Table:
    """Per workload and server: the median round's tok/s (spread beside it), time per output token, the
    bandwidth share at one stream, and the ratios to llama.cpp's and (with a draft) to the same server's
    without one."""
    t = Table(
        title=load.title(f"Qwen2.5-Coder-1.5B Q4_K_M, streamed chat; read bandwidth {bandwidth:.1f} GB/s")
    )
    t.caption = load.busy
    columns = ("workload", "server", "tok/s", "spread", "TPOT ms", "bandwidth share", "vs llama.cpp")
    columns += ("vs no speculation",)
    for column in columns:
        t.add_column(column, justify="left" if column in ("workload", "server") else "right")
    loads = ["1 stream", "1 stream, code", "4 streams", "8 streams", "prefill 512", "prefill 2000"]
    for name in loads:
        base = median(rounds.get("llama.cpp", []), name, "tok_s")
        for label, results in rounds.items():
            tok_s = median(results, name, "tok_s")
            if tok_s is None:
                continue
            tpot = median(results, name, "tpot_ms")
            weights = statistics.median(r["decode_weight_bytes"] for r in results)
            # the weights a decode step reads over the time a token takes, against what the machine reads
            # a second (past 100 %: more than one token for one read of the weights, speculation)
            share = f"{weights / 1e6 / tpot / bandwidth:.0%}" if name.startswith("1 stream") and tpot else "-"
            plain = median(rounds.get(WITHOUT_SPECULATION.get(label, ""), []), name, "tok_s")
            values = [r[name]["tok_s"] for r in results if name in r]
            t.add_row(
                name,
                label,
                f"{tok_s:,.1f}",
                spread(values, ",.1f"),
                f"{tpot:.1f}" if tpot else "-",
                share,
                f"{tok_s / base:.2f}x" if base else "-",
                f"{tok_s / plain:.2f}x" if plain else "-",
            )
    return t


def speculation_table(rounds: dict[str, list[dict]], load: MachineLoad) -> Table:
    t = Table(
        title=load.title(
            f"llmopt's speculation: prompt lookup (default), the 0.5B draft ({DRAFT_TOKENS} a step)"
        )
    )
    for column in ("server", "acceptance", "tokens per verification"):
        t.add_column(column, justify="left" if column == "server" else "right")
    for label, results in rounds.items():
        spec = [r["speculation"] for r in results if r.get("speculation")]
        if spec:
            t.add_row(
                label,
                f"{statistics.median(s['acceptance'] for s in spec):.0%}",
                f"{statistics.median(s['tokens_per_step'] for s in spec):.2f}",
            )
    return t


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    args = ap.parse_args()
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    if 3 * args.rounds > len(CODE_TASKS):
        ap.error(f"--rounds {args.rounds}: there are coding tasks for {len(CODE_TASKS) // 3} rounds")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    bandwidth = read_bandwidth_gbs()
    rounds = run_rounds(args, console)
    tables = [table(rounds, bandwidth, load), speculation_table(rounds, load)]
    for t in tables:
        console.print(t)
    out = {"args": vars(args), "bandwidth_gbs": bandwidth, "rounds": rounds}
    console.print(f"wrote {write_result('real_model', {**out, **load.finish(console)}, tables)}")


if __name__ == "__main__":
    main()
