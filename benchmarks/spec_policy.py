"""llmopt's default speculation against none, paired in one process on a real model (issue #51: `auto`
never below 0.98x of off). `speculative_config="auto"` is prompt lookup paced by measured cost
(llmopt/engine/spec_decode/policy.py): it should win where answers copy their prompt and cost nothing
where lookups fail, at one stream and at many.

Two workloads, greedy, every answer to its full length (ignore_eos, so both modes write the same tokens):
- chat: ~128-token prose prompts from the corpus, 64 tokens out: lookups mostly fail, the case the
  criterion is about;
- code: short coding tasks, 160 tokens out: answers copy identifiers, where lookups pay.
At --streams 1, 4 and 8, with continuous arrivals: 2x streams requests (at least 4), `streams` kept in
flight, a new one added as one finishes. Every (workload, streams, repeat) point has fresh prompts, the
same for both modes, and the text each writes is checked equal (speculation must not change greedy
output). Prefix caching is off, so neither mode's prefill is served from a cache.

Each mode has its own engine (the model mapped once from the saved loaded model, so both read the same
pages), and the two runs of a point take turns step by step: a mode's time is the sum of its own steps.
The 2-core VM's speed swings by a third over tens of seconds; modes taking turns a run at a time put those
swings into the ratio (pairs of one point ranged 0.79x-1.02x), taking turns a step at a time cancels them.

Per point: off's and auto's output tok/s (mean over repeats), auto/off (the mean of each repeat's paired
ratio) and the lowest paired ratio; auto's acceptance, tokens per verification and proposed positions per
output token (its lookup share). The default 2 repeats take ~9 minutes. Refuses a busy machine (1-minute
load over 0.5) unless --allow-busy.
Writes results/spec_policy_<model>.json (`make figures` renders docs/figures/ from it).

    .venv/bin/python benchmarks/spec_policy.py [--model qwen2.5-coder-1.5b] [--streams 1,4,8]
        [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness import CorpusCursor, MachineLoad, rotated
from real_models import MODELS, model_argument, result_name
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from results import write_result

MODES = ("off", "auto")
CHAT_PROMPT_TOKENS = 128
# Fresh coding tasks: every function in every language is asked once a run (56 with the defaults, 112
# with --repeats 4).
FUNCTIONS = [
    "merges two sorted lists into one sorted list",
    "returns the n-th Fibonacci number iteratively",
    "checks whether a string is a palindrome, ignoring case and punctuation",
    "counts how often each word occurs in a text",
    "flattens a nested list of integers",
    "computes the edit distance between two strings",
    "parses a query string like 'a=1&b=2' into a map",
    "returns the k most frequent elements of a list",
    "rotates a square matrix by 90 degrees clockwise",
    "validates an IPv4 address given as a string",
    "groups a list of words into anagram groups",
    "implements binary search over a sorted array",
    "converts a Roman numeral to an integer",
    "removes duplicate entries from a list while keeping their order",
    "finds the longest common prefix of a list of strings",
    "converts a snake_case identifier to camelCase",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "TypeScript", "C++", "C#"]


@dataclass(frozen=True)
class Workload:
    name: str
    output_len: int


WORKLOADS = (Workload("chat", 64), Workload("code", 160))


@dataclass
class Prompts:
    """Fresh chat-templated prompts: chat text cut from the corpus, coding tasks never asked before."""

    engine: LLMEngine
    corpus: CorpusCursor
    tasks: Iterator[tuple[str, str]] = field(default_factory=lambda: itertools.product(LANGUAGES, FUNCTIONS))

    def take(self, workload: str, count: int) -> list[list[int]]:
        if workload == "chat":
            texts = [r.prompt for r in self.corpus.requests(count, CHAT_PROMPT_TOKENS, 1)]
        else:
            asked = list(itertools.islice(self.tasks, count))
            if len(asked) < count:
                raise SystemExit("no fresh coding task left: ask for fewer streams or repeats")
            texts = [
                f"Write a {language} function that {what}, with a short usage example."
                for language, what in asked
            ]
        return [self.engine.chat_token_ids([{"role": "user", "content": text}]) for text in texts]


@dataclass
class Run:
    """One mode's run of a point's prompts: the seconds of its own steps, each prompt's output, auto's
    proposals."""

    seconds: float
    outputs: list[list[int]]
    drafts: int  # verifications with proposals
    proposed: int
    accepted: int

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def requests(streams: int) -> int:
    """A point's requests: enough that new ones arrive while `streams` others run."""
    return max(2 * streams, 4)


class Arrivals:
    """Every prompt to `output_len` tokens on one engine, `streams` in flight: a new one joins when one
    finishes. Advanced a step at a time, so that two modes' runs can take turns step by step; `seconds`
    counts only this run's own steps (admissions included)."""

    def __init__(self, engine: LLMEngine, prompts: list[list[int]], streams: int, output_len: int) -> None:
        engine.scheduler.max_num_seqs = streams
        self.engine, self.streams = engine, streams
        self.params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
        self.before = engine.stats()
        self.index: dict[str, int] = {}
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.waiting = list(enumerate(prompts))
        self.seconds = 0.0

    @property
    def done(self) -> bool:
        return not self.waiting and not self.engine.has_unfinished_requests()

    def step(self) -> None:
        start = time.perf_counter()
        while self.waiting and len(self.index) < self.streams:
            i, prompt = self.waiting.pop(0)
            self.index[self.engine.add_request(prompt, self.params)] = i
        for out in self.engine.step():
            self.outputs[self.index[out.request_id]] += out.new_token_ids
            if out.finished:
                del self.index[out.request_id]
        self.seconds += time.perf_counter() - start

    def run(self) -> Run:
        after = self.engine.stats()
        return Run(
            self.seconds,
            self.outputs,
            after.spec_drafts - self.before.spec_drafts,
            after.spec_draft_tokens - self.before.spec_draft_tokens,
            after.spec_accepted_tokens - self.before.spec_accepted_tokens,
        )


def run_in_turns(runs: list[Arrivals]) -> None:
    """Step each run in turn, the first alternating every round, until all are done: the VM's speed,
    which swings by a third over tens of seconds (one mode's 25-second run measured 31 ms a step, the
    other's next to it 45), then falls on every mode alike, step by step."""
    for round_index in itertools.count():
        pending = [r for r in runs if not r.done]
        if not pending:
            return
        for run in rotated(pending, round_index):
            run.step()


@dataclass
class Point:
    workload: str
    streams: int
    runs: dict[str, list[Run]] = field(default_factory=lambda: {m: [] for m in MODES})

    def ratios(self) -> list[float]:
        return [a.tok_s / o.tok_s for a, o in zip(self.runs["auto"], self.runs["off"])]

    def to_json(self) -> dict:
        auto = self.runs["auto"]
        proposed, accepted, drafts = (
            sum(getattr(r, k) for r in auto) for k in ("proposed", "accepted", "drafts")
        )
        return {
            "workload": self.workload,
            "streams": self.streams,
            "off_tok_s": [r.tok_s for r in self.runs["off"]],
            "auto_tok_s": [r.tok_s for r in auto],
            "paired_ratios": self.ratios(),
            "auto_acceptance": accepted / proposed if proposed else None,
            "auto_tokens_per_verification": 1 + accepted / drafts if drafts else None,
            "auto_proposed_per_token": proposed / sum(r.tokens for r in auto),
        }


def measure(engines: dict[str, LLMEngine], args: argparse.Namespace, console: Console) -> list[Point]:
    prompts = Prompts(engines["off"], CorpusCursor(engines["off"].tokenizer))
    for engine in engines.values():  # each mode's first steps (and its row counts' first costs) untimed
        run_in_turns([Arrivals(engine, prompts.take("chat", 1), 1, 16)])
    points = []
    for workload in WORKLOADS:
        for streams in args.streams:
            point = Point(workload.name, streams)
            for repeat in range(args.repeats):
                batch = prompts.take(workload.name, requests(streams))
                output_len = args.output_len or workload.output_len
                arrivals = {mode: Arrivals(engines[mode], batch, streams, output_len) for mode in MODES}
                run_in_turns(list(arrivals.values()))
                for mode in MODES:
                    point.runs[mode].append(arrivals[mode].run())
                off, auto = point.runs["off"][-1], point.runs["auto"][-1]
                console.print(
                    f"{workload.name}, {streams} streams, repeat {repeat + 1}: off {off.tok_s:.1f} tok/s, "
                    f"auto {auto.tok_s:.1f} tok/s ({auto.tok_s / off.tok_s:.3f}x)"
                )
                assert auto.outputs == off.outputs, (
                    f"auto changed the greedy text ({workload.name}, {streams} streams)"
                )
            points.append(point)
    return points


def table(points: list[Point], title: str, load: MachineLoad) -> Table:
    t = Table(title=load.title(title))
    t.caption = load.busy
    columns = ("workload", "streams", "off tok/s", "auto tok/s", "auto/off", "lowest pair")
    columns += ("acceptance", "tokens/verification", "proposed/token")
    for column in columns:
        t.add_column(column, justify="left" if column == "workload" else "right")
    for point in points:
        spec = point.to_json()
        acceptance, per_verification = spec["auto_acceptance"], spec["auto_tokens_per_verification"]
        t.add_row(
            point.workload,
            str(point.streams),
            f"{statistics.mean(spec['off_tok_s']):.1f}",
            f"{statistics.mean(spec['auto_tok_s']):.1f}",
            f"{statistics.mean(point.ratios()):.3f}x",
            f"{min(point.ratios()):.3f}x",
            "-" if acceptance is None else f"{acceptance:.0%}",
            "-" if per_verification is None else f"{per_verification:.2f}",
            f"{spec['auto_proposed_per_token']:.2f}",
        )
    return t


def engine_for(model: str, mode: str, max_num_seqs: int) -> LLMEngine:
    """A mode's engine. The loaded model is mapped from one saved file, so the two engines share its
    pages (and memory reads) instead of holding two copies."""
    engine = LLMEngine(
        EngineConfig(
            model=model,
            speculative_config=None if mode == "off" else mode,
            enable_prefix_caching=False,
            kv_disk_gb=0,
            max_num_seqs=max_num_seqs,
            max_model_len=4096,
        )
    )
    engine.warm_up()
    return engine


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default="qwen2.5-coder-1.5b", help="of " + ", ".join(MODELS) + ", or a .gguf or folder"
    )
    ap.add_argument("--streams", default="1,4,8", help="comma-separated stream counts")
    # Two: each point on two sets of fresh prompts (the run takes ~9 minutes on the 2-core machine; each
    # further repeat adds ~4).
    ap.add_argument("--repeats", type=int, default=2, help="paired runs of each point, on fresh prompts")
    ap.add_argument("--output-len", type=int, default=None, help="tokens out (default: 64 chat, 160 code)")
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 and 2 streams, 1 repeat, 16 out")
    args = ap.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.quick:
        args.streams, args.repeats, args.output_len = [1, 2], 1, 16
    tasks = args.repeats * sum(requests(streams) for streams in args.streams)
    if tasks > len(FUNCTIONS) * len(LANGUAGES):
        ap.error(f"{tasks} coding tasks asked, {len(FUNCTIONS) * len(LANGUAGES)} fresh ones: fewer repeats")
    args.model_file = model_argument(args.model)
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console, peer_comparison=not args.quick, allow_busy=args.allow_busy)
    engines = {mode: engine_for(args.model_file, mode, max(args.streams)) for mode in MODES}
    points = measure(engines, args, console)
    title = (
        f"speculation auto against off, paired in one process: {args.model}, greedy, continuous arrivals "
        f"(2x streams requests), fresh prompts, {args.repeats} repeats taking turns"
    )
    printed = table(points, title, load)
    console.print(printed)
    lowest = min(min(p.ratios()) for p in points)
    console.print(f"lowest paired auto/off: {lowest:.3f}x")
    out = {"args": vars(args), "points": [p.to_json() for p in points], "lowest_paired_ratio": lowest}
    name = result_name("spec_policy", args.model) + ("_quick" if args.quick else "")
    console.print(f"wrote {write_result(name, {**out, **load.finish(console)}, [printed])}")


if __name__ == "__main__":
    main()
