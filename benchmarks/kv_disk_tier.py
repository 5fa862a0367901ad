"""The KV disk tier (issue #53): agent sessions that outnumber the KV pool, resumed after their think
time and again after a server restart, on Qwen2.5-Coder-1.5B Q4_K_M, one server at a time.

Each of --sessions sessions is an agent's: a shared system prompt with the tool definitions, then a
history of its own (--history tokens of fresh corpus text: the files and results it read so far), then
turns that each add the assistant's tool call and a --turn-len-token tool result. The sessions take their
turns one after another: every session's first turn (its history prefilled), then every session's second
in the same order (the think time of each is the other sessions' turns: by then a pool that holds fewer
sessions has evicted it), then the server is stopped and started again and every session takes a third
turn. Answers are --output-len tokens, greedy, streamed (tools written as text, so every server gets the
same bytes). TTFT is per turn, sent to first token; the server's usage says what it cached (llmopt's
prompt_tokens_details.disk_cached_tokens: how much of it from disk).

Subjects, each started as a user starts it (`llmopt serve MODEL ...`):
- llmopt with the tier (on by default; a folder of its own, kept across its restart),
- llmopt with `--kv-disk-gb 0` (its resumed turns recompute what the pool evicted: the baseline),
- llama.cpp's server (`--engine llama.cpp`, its default prompt cache: 8 GiB of host RAM; one slot).
llmopt's pool is --pool-gb (small, so that the sessions outnumber it); llama.cpp gets one slot of
--max-model-len tokens. The machine must be idle (1-minute load under 0.5) unless --allow-busy.

Goals: a resumed turn's TTFT <= 0.1x of recomputing its prefix (the no-tier subject's) and <= 0.3x of
llama.cpp's; the first turn after a restart <= 0.1x of recompute. Writes results/kv_disk_tier.json.

    .venv/bin/python benchmarks/kv_disk_tier.py [--sessions 8] [--history 4000] [--pool-gb 0.4]
        [--subjects tier,no-tier,llama.cpp] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import SERVED, CorpusCursor, MachineLoad, fresh_kv_dir, peer_installed, subject_names
from rich.console import Console
from rich.table import Table

from llmopt.bench import AGENT_SYSTEM_HEADER as SYSTEM_HEADER
from llmopt.bench import AGENT_TOOLS as TOOLS
from llmopt.bench import (
    Conversation,
    Target,
    ToolCall,
    Turn,
    client_session,
    count_tokens,
    llmopt_server,
    parse_metrics,
    send,
    text_of_length,
)
from llmopt.checkpoints import load_tokenizer
from results import write_result

MODEL = Path.home() / ".cache" / "llmopt" / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SUBJECTS = {  # --subjects' names -> label
    "tier": "llmopt, disk tier",
    "no-tier": "llmopt --kv-disk-gb 0",
    "llama.cpp": "llama.cpp (RAM prompt cache)",
}
PHASES = ("first", "resumed", "restarted")  # turns 0, 1 and 2 of every session
DISK_COUNTERS = ("kv_disk_bytes_written_total", "kv_disk_bytes_read_total", "kv_disk_blocks_missed_total")


@dataclass(frozen=True)
class Shape:
    sessions: int
    history: int
    turn_len: int
    output_len: int
    pool_gb: float
    max_model_len: int

    def title(self) -> str:
        return (
            f"KV disk tier: {self.sessions} agent sessions x {self.history:,}-token histories, "
            f"{self.turn_len}-token tool results, {self.output_len} tokens out; llmopt pool {self.pool_gb} GB"
        )


def conversations(tokenizer, shape: Shape) -> list[Conversation]:
    """Every session's turns: its history first, then tool results; the tools listed in the system prompt
    (as text: no `tools` field, so that every server gets the same bytes)."""
    cursor = CorpusCursor(tokenizer)
    system = SYSTEM_HEADER + "\n".join(str(t["function"]) for t in TOOLS)
    out = []
    for i in range(shape.sessions):
        history = text_of_length(tokenizer, cursor.take(shape.history + 8), shape.history)
        turns = [Turn(f"Here is what I have read so far:\n{history}", shape.output_len, shape.history)]
        for k in (1, 2):
            result = text_of_length(tokenizer, cursor.take(shape.turn_len + 8), shape.turn_len)
            call = ToolCall(f"call_{i}_{k}", TOOLS[k % len(TOOLS)]["function"]["name"], '{"query": "next"}')
            turns.append(Turn(result, shape.output_len, shape.turn_len, call))
        out.append(Conversation(turns, system, count_tokens(tokenizer, system)))
    return out


def server_args(name: str, shape: Shape) -> list[str]:
    common = [str(MODEL), "--max-model-len", str(shape.max_model_len)]
    if name == "llama.cpp":
        return [*common, "--engine", "llama.cpp", "--max-num-seqs", "1"]
    extra = ["--kv-disk-gb", "0"] if name == "no-tier" else []
    return [*common, "--kv-cache-memory-gb", str(shape.pool_gb), *extra]


async def take_turn(
    target: Target, convs: list[Conversation], k: int, answers: list[list[str]]
) -> list[dict]:
    """Turn `k` of every session, one after another; each answer is kept for the next turn's history."""
    rows = []
    async with client_session(target) as session:
        for i, conv in enumerate(convs):
            request = conv.request(k, answers[i], 0, tools=False)
            record = await send(session, target, request, i, 0.0)
            if not record.success:
                raise SystemExit(f"session {i} turn {k} failed: {record.error}")
            answers[i].append(record.text or "")
            rows.append(
                {
                    "ttft_s": record.ttft,
                    "prompt_tokens": record.prompt_tokens,
                    "cached_tokens": record.cached_tokens,
                    "disk_cached_tokens": record.disk_cached_tokens,
                }
            )
    return rows


def run_subject(name: str, shape: Shape, convs: list[Conversation], console: Console) -> dict:
    """Two server processes, one after the other, sharing the subject's KV folder: the first and
    resumed turns on the first, the third turns after the restart."""
    args = [*server_args(name, shape), "--served-model-name", SERVED]
    env = {**os.environ, "LLMOPT_KV_DIR": fresh_kv_dir()}  # one tier for both processes
    answers: list[list[str]] = [[] for _ in convs]
    result: dict = {"phases": {}, "disk": {}}
    for run, phases in (("before restart", PHASES[:2]), ("after restart", PHASES[2:])):
        with llmopt_server(args, ready_timeout_s=900, env=env) as server:
            target = Target(endpoint=server.url + "/v1", model=SERVED, api="chat")
            for phase in phases:
                rows = asyncio.run(take_turn(target, convs, PHASES.index(phase), answers))
                result["phases"][phase] = rows
                ttft = statistics.median(r["ttft_s"] for r in rows)
                console.print(f"  {SUBJECTS[name]}: {phase} turns, median TTFT {ttft:.2f} s")
            result["disk"][run] = disk_counters(server.url)
    return result


def disk_counters(url: str) -> dict[str, float | None]:
    """The disk tier's counters from llmopt's /metrics (None for a server without them)."""
    try:
        metrics = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
    except (httpx.HTTPError, ValueError):
        metrics = {}
    return {c: metrics.get(f"llmopt:{c}") for c in DISK_COUNTERS}


def step_times(rounds: int, console: Console) -> dict:
    """The engine's decode step with the tier on and off when no block moves (a pool that holds every
    sequence), in process, on the bundled default model (the shortest step: the tier's bookkeeping
    weighs most there): 16 sequences of 128 prompt tokens decoding 64 each, the two engines taking turns
    over `rounds`; each round's median decode step, and the ratio of the medians over rounds."""
    from llmopt.engine.llm import LLM
    from llmopt.engine.sampling_params import SamplingParams

    os.environ["LLMOPT_KV_DIR"] = fresh_kv_dir()
    engines = {"off": LLM(max_num_seqs=16, kv_disk_gb=0), "on": LLM(max_num_seqs=16)}
    cursor = CorpusCursor(engines["on"].tokenizer)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    medians: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        prompts = cursor.prompts(16, 128)
        for name, llm in engines.items():
            steps: list[float] = []

            def decode_step(record, steps=steps) -> None:
                if not record.prefill_tokens:
                    steps.append(record.duration_s)

            llm.engine.step_log.step_observers.append(decode_step)
            llm.generate(prompts, params)
            llm.engine.step_log.step_observers.remove(decode_step)
            medians[name].append(statistics.median(steps))
    queued = engines["on"].engine.disk_tier.stats.blocks_queued
    ratio = statistics.median(medians["on"]) / statistics.median(medians["off"])
    console.print(f"decode step, no block moved ({queued} queued): tier on / off = {ratio:.3f}x")
    ms = {k: [v * 1e3 for v in vs] for k, vs in medians.items()}
    return {"median_step_ms": ms, "ratio": ratio, "blocks_queued": queued}


def median_ttft(result: dict, phase: str) -> float:
    return statistics.median(r["ttft_s"] for r in result["phases"][phase])


def cached_cell(result: dict, phase: str) -> str:
    rows = result["phases"][phase]
    prompt = sum(r["prompt_tokens"] for r in rows)
    told = [r for r in rows if r["cached_tokens"] is not None]
    if not told:
        return "-"
    cached = sum(r["cached_tokens"] for r in told) / prompt
    disk = [r["disk_cached_tokens"] for r in told if r["disk_cached_tokens"] is not None]
    return f"{cached:.0%} ({sum(disk) / prompt:.0%} disk)" if disk else f"{cached:.0%}"


def disk_cell(result: dict) -> str:
    gb = [
        (v.get("kv_disk_bytes_written_total"), v.get("kv_disk_bytes_read_total"))
        for v in result["disk"].values()
    ]
    if any(w is None for w, _ in gb):
        return "-"
    return f"{sum(w for w, _ in gb) / 1e9:.2f} / {sum(r for _, r in gb) / 1e9:.2f}"


def ratio(value: float, base: float | None) -> str:
    return "-" if base is None else f"{value / base:.3f}x"


def table(results: dict[str, dict], shape: Shape, load: MachineLoad) -> Table:
    t = Table(title=load.title(shape.title()))
    columns = ["subject", "first turn TTFT", "resumed TTFT", "resumed cached", "after restart TTFT"]
    columns += ["restart cached", "disk GB written / read", "resumed vs recompute", "resumed vs llama.cpp"]
    columns += ["restart vs recompute"]
    for column in columns:
        t.add_column(column, justify="left" if column == "subject" else "right")
    recompute = median_ttft(results["no-tier"], "resumed") if "no-tier" in results else None
    peer = median_ttft(results["llama.cpp"], "resumed") if "llama.cpp" in results else None
    for name, result in results.items():
        resumed, restarted = median_ttft(result, "resumed"), median_ttft(result, "restarted")
        t.add_row(
            SUBJECTS[name],
            f"{median_ttft(result, 'first'):.2f} s",
            f"{resumed:.2f} s",
            cached_cell(result, "resumed"),
            f"{restarted:.2f} s",
            cached_cell(result, "restarted"),
            disk_cell(result),
            ratio(resumed, recompute),
            ratio(resumed, peer),
            ratio(restarted, recompute),
        )
    t.caption = "TTFT: median over the sessions; cached: share of the prompt tokens (of it from disk)"
    return t


def step_table(steps: dict) -> Table:
    t = Table(title="engine decode step when no block moves (bundled model, 16 sequences, in process)")
    for column in ("tier", "median step per round", "ratio to off"):
        t.add_column(column, justify="left" if column == "tier" else "right")
    for name in ("off", "on"):
        rounds = ", ".join(f"{v:.2f}" for v in steps["median_step_ms"][name])
        t.add_row(name, f"{rounds} ms", "1.000x" if name == "off" else f"{steps['ratio']:.3f}x")
    return t


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--history", type=int, default=4000, help="tokens of each session's own history")
    ap.add_argument("--turn-len", type=int, default=64, help="tokens of each tool result")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--pool-gb", type=float, default=0.4, help="llmopt's KV pool (--kv-cache-memory-gb)")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument("--step-rounds", type=int, default=5, help="rounds of the step-time check (0: none)")
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 sessions x 600 tokens, 0.1 GB")
    args = ap.parse_args(argv)
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    if args.quick:
        args.sessions, args.history, args.pool_gb, args.max_model_len = 4, 600, 0.1, 2048
        args.step_rounds = min(args.step_rounds, 1)
    return args


def main() -> None:
    args = parse_args()
    if not MODEL.exists():
        raise SystemExit(f"{MODEL} is missing: run `make real-models`")
    console = Console(width=200)
    load = MachineLoad.begin(console, peer_comparison=not args.quick, allow_busy=args.allow_busy)
    shape = Shape(
        args.sessions, args.history, args.turn_len, args.output_len, args.pool_gb, args.max_model_len
    )
    convs = conversations(load_tokenizer(MODEL), shape)
    names = [n for n in args.subjects if n != "llama.cpp" or peer_installed(n)]
    steps = step_times(args.step_rounds, console) if args.step_rounds else None
    results = {name: run_subject(name, shape, convs, console) for name in names}
    printed = [table(results, shape, load)] + ([step_table(steps)] if steps else [])
    for t in printed:
        console.print(t)
    out = {"args": vars(args), "shape": shape.title(), "results": results, "step_time": steps}
    name = "kv_disk_tier" + ("_quick" if args.quick else "")
    path = write_result(name, {**out, **load.finish(console)}, printed)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
