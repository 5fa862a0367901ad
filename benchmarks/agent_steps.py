"""Where the agent loop's time goes (issue #19): the workload of serving_path.py part (b) run against the
engine in-process, no HTTP, each session sending its next turn as soon as its answer ends (the history
re-rendered through the chat template with the answer's text, as a client replays it), and the engine's
step log (llmopt/engine/step_log.py) summed up: steps by kind and their time, the time between steps, the
prefill and decode work, and per turn the prefix-cache hit against the most the cache could have held
(the longest prefix shared with any sequence before it, in whole blocks, the last prompt token left out).

The same summary reads a served run's step trace: `LLMOPT_STEP_TRACE=FILE llmopt serve ...`, then
`--trace FILE` (steps and requests only: a trace has no tokens to judge the hits by).

    .venv/bin/python benchmarks/agent_steps.py [--sessions 4] [--turns 10] [--system-len 1000]
        [--turn-len 64] [--output-len 24] [--budget 512] [--no-sharing] [--dtype auto] [--trace FILE]

Wall time here is that of a run on whatever else the machine runs: read the CPU-time column beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from harness import MachineLoad
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.bench import Conversation, agent_conversations
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.step_log import RequestTrace, StepRecord
from results import write_result


@dataclass
class Session:
    conv: Conversation
    answers: list[str] = field(default_factory=list)
    turn: int = 0
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # the running turn's prompt, then its outputs


@dataclass
class Turn:
    session: int
    turn: int
    prompt_tokens: int
    best_hit: int  # the most the prefix cache could have served (whole blocks)
    intake_s: float  # chat template and tokenizing, on the driving thread


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Driver:
    """Sessions against one engine, stepped on this thread: a turn goes in when the previous one ends."""

    def __init__(self, engine: LLMEngine, conversations: list[Conversation], output_len: int):
        self.engine = engine
        self.sessions = [Session(c) for c in conversations]
        self.params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
        self.by_request: dict[str, int] = {}
        self.seen: list[list[int]] = []  # every finished sequence's tokens (prompt and outputs)
        self.turns: dict[str, Turn] = {}  # by request id

    def submit(self, index: int) -> None:
        session, start = self.sessions[index], time.perf_counter()
        messages = session.conv.messages(session.turn, session.answers, False)
        ids = self.engine.chat_token_ids(messages)
        request_id = self.engine.add_request(ids, self.params)
        bs = self.engine.config.block_size
        shared = max((common_prefix(ids, s) for s in self.seen), default=0)
        best = min(shared, len(ids) - 1) // bs * bs
        self.turns[request_id] = Turn(index, session.turn, len(ids), best, time.perf_counter() - start)
        self.by_request[request_id] = index
        session.tokens, session.text = list(ids), ""

    def run(self) -> float:
        start = time.perf_counter()
        for i in range(len(self.sessions)):
            self.submit(i)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                index = self.by_request[out.request_id]
                session = self.sessions[index]
                session.text += out.new_text
                session.tokens += out.new_token_ids
                if out.finished:
                    self.seen.append(session.tokens)
                    session.answers.append(session.text)
                    session.turn += 1
                    if session.turn < len(session.conv.turns):
                        self.submit(index)
        return time.perf_counter() - start


def summarize(steps: list[StepRecord], requests: list[RequestTrace], wall_s: float | None) -> dict:
    busy = sum(s.duration_s for s in steps)
    decode_only = [s for s in steps if s.prefill_tokens == 0]
    with_prefill = [s for s in steps if s.prefill_tokens]
    by_rows: dict[int, list[float]] = {}
    for s in decode_only:
        by_rows.setdefault(s.decode_rows, []).append(s.duration_s)
    prefill_tokens = sum(s.prefill_tokens for s in with_prefill)
    out = {
        "wall_s": wall_s,
        "steps": len(steps),
        "busy_s": busy,
        "cpu_s": sum(s.cpu_s for s in steps),
        "idle_between_steps_s": sum(s.idle_before_s for s in steps[1:]),
        "schedule_s": sum(s.schedule_s for s in steps),
        "forward_s": sum(s.forward_s for s in steps),
        "decode_only_steps": len(decode_only),
        "decode_only_s": sum(s.duration_s for s in decode_only),
        "decode_step_ms_by_rows": {
            rows: {"steps": len(d), "median_ms": 1000 * statistics.median(d)}
            for rows, d in sorted(by_rows.items())
        },
        "prefill_steps": len(with_prefill),
        "prefill_steps_s": sum(s.duration_s for s in with_prefill),
        "prefill_tokens": prefill_tokens,
        "prefill_ms_per_token": 1000 * sum(s.duration_s for s in with_prefill) / max(prefill_tokens, 1),
        "decode_rows_in_prefill_steps": sum(s.decode_rows for s in with_prefill),
        "requests": len(requests),
        "prompt_tokens": sum(r.prompt_tokens for r in requests),
        "cached_tokens": sum(r.cached_tokens for r in requests),
        "queue_ms_median": 1000 * statistics.median([r.queue_s or 0.0 for r in requests])
        if requests
        else None,
        "ttft_ms_median": 1000 * statistics.median([r.ttft_s or 0.0 for r in requests]) if requests else None,
    }
    return out


def print_summary(title: str, summary: dict, console: Console) -> Table:
    table = Table(title=title)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:.3f}"
        elif isinstance(value, dict):
            value = json.dumps(value, default=str)
        table.add_row(key, str(value))
    console.print(table)
    return table


def read_trace(path: str) -> tuple[list[StepRecord], list[RequestTrace]]:
    steps, requests = [], []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            kind = record.pop("kind")
            (
                steps.append(StepRecord(**record))
                if kind == "step"
                else requests.append(RequestTrace(**record))
            )
    return steps, requests


def run_in_process(args: argparse.Namespace, console: Console) -> dict:
    config = EngineConfig(
        max_num_seqs=16,
        max_model_len=4096,
        max_num_batched_tokens=args.budget,
        inflight_prefix_sharing=not args.no_sharing,
        dtype=args.dtype,
    )
    engine = LLMEngine(config)
    conversations = agent_conversations(
        engine.tokenizer,
        args.sessions,
        args.system_len,
        args.turn_len,
        args.output_len,
        args.turns,
        seed=1000,  # serving_path.py's first round
        tools="text",
    )
    warm = Driver(engine, agent_conversations(engine.tokenizer, 1, 64, 16, 4, 1, 7, tools="text"), 4)
    warm.run()
    engine.reset_prefix_cache()
    steps: list[StepRecord] = []
    requests: list[RequestTrace] = []
    engine.step_log.step_observers.append(steps.append)
    engine.step_log.request_observers.append(requests.append)
    driver = Driver(engine, conversations, args.output_len)
    wall = driver.run()
    summary = summarize(steps, requests, wall)
    first = [r.ttft_s for r in requests if driver.turns[r.request_id].turn == 0 and r.ttft_s is not None]
    summary["first_turn_ttft_ms_median"] = 1000 * statistics.median(first) if first else None
    summary["best_cached_tokens"] = sum(t.best_hit for t in driver.turns.values())
    summary["intake_s"] = sum(t.intake_s for t in driver.turns.values())
    turns = [(driver.turns[r.request_id], r) for r in requests]
    summary["misses_beyond_best"] = [
        (t.session, t.turn, t.prompt_tokens, t.best_hit, r.cached_tokens)
        for t, r in turns
        if t.best_hit != r.cached_tokens
    ]
    return {
        "summary": summary,
        "steps": [asdict(s) for s in steps],
        "requests": [asdict(r) for r in requests],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--turn-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=24)
    ap.add_argument("--budget", type=int, default=512, help="--max-num-batched-tokens")
    ap.add_argument("--no-sharing", action="store_true", help="in-flight prefix sharing off")
    ap.add_argument("--dtype", default="float32", help="the engine's --dtype (auto: the GGUF's Q4_1 kernels)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's); 1 on a busy machine")
    ap.add_argument("--trace", help="summarize this step trace (LLMOPT_STEP_TRACE) instead of running")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=170)
    load = MachineLoad.begin(console)
    if args.trace:
        steps, requests = read_trace(args.trace)
        result = {"summary": summarize(steps, requests, None)}
    else:
        result = run_in_process(args, console)
    table = print_summary(
        load.title(f"agent loop, step log ({args.trace or 'in-process'})"), result["summary"], console
    )
    path = write_result("agent_steps", {"args": vars(args), **result, **load.finish(console)}, [table])
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
