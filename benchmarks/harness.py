"""What the benchmarks share: the machine's load average (printed and recorded at the start and the end
of every run; a comparison against a peer refuses a busy machine), the order in which subjects take
turns, prompts cut from the corpus that no earlier prompt of the run used, spreads over rounds, and the
tail percentile a sample is large enough for."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from llmopt.bench import BenchRequest, corpus_token_ids, text_of_length
from llmopt.engine_servers.llmopt import llmopt_serve_argv

ROOT = Path(__file__).resolve().parent.parent
# Where each peer's Python is found: its environment variable, else the venv `make peers` builds.
PEER_PYTHONS = {
    "vllm": ("LLMOPT_VLLM_PYTHON", ".vllm-venv"),
    "llama.cpp": ("LLMOPT_LLAMA_CPP_PYTHON", ".peer-venv"),
}
SERVED = "subject"  # every subject serves under this name, so one Target fits all

# Above this 1-minute load average another job shares the 2 cores, and a comparison against llama.cpp
# or vLLM would measure that job as much as the servers: such comparisons refuse to start.
BUSY_LOAD = 0.5


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class MachineLoad:
    """The 1-minute load average at the start and end of a run; `busy` is the mark every table and the
    JSON of a peer comparison carry when it ran on a busy machine anyway (--allow-busy)."""

    start: float
    end: float | None = None
    busy: str | None = None

    @classmethod
    def begin(cls, console: Console, peer_comparison: bool = False, allow_busy: bool = False) -> MachineLoad:
        load = cls(start=load_average())
        console.print(f"load average (1 min) at start: {load.start:.2f}")
        if peer_comparison and load.start > BUSY_LOAD:
            if not allow_busy:
                raise SystemExit(
                    f"the machine is busy (1-minute load average {load.start:.2f}, above {BUSY_LOAD}): a "
                    "comparison against a peer would measure the other work too. Wait for it to finish, "
                    "or pass --allow-busy to run anyway (every table is then marked as not a result)."
                )
            load.busy = f"BUSY MACHINE: load {load.start:.2f} — not a result"
            console.print(f"[bold red]{load.busy}[/bold red]")
        return load

    def title(self, text: str) -> str:
        """A table title, marked when the run is not a result."""
        return f"{self.busy}\n{text}" if self.busy else text

    def finish(self, console: Console) -> dict:
        """Read the load at the end, print both, and return them for the JSON."""
        self.end = load_average()
        console.print(f"load average (1 min): {self.start:.2f} at start, {self.end:.2f} at end")
        if self.busy:
            console.print(f"[bold red]{self.busy}[/bold red]")
        record: dict = {"load_average_1min": {"start": self.start, "end": self.end}}
        if self.busy:
            record["busy_machine"] = self.busy
        return record


def rotated(items: list, round_index: int) -> list:
    """`items` starting at a different one each round, so that no subject always runs first (right after
    a warm-up or a model load) or always right after the same neighbour."""
    shift = round_index % len(items) if items else 0
    return items[shift:] + items[:shift]


def spread(values: list[float], fmt: str = ".1f") -> str:
    """min-max of a subject's rounds, shown beside the figure kept."""
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def tail_latency(values_s: list[float]) -> dict:
    """The highest percentile the sample supports: p99 from 100 samples, p90 from 10, else the maximum
    (the p99 of 4 samples is just the largest one)."""
    n = len(values_s)
    if n == 0:
        return {"stat": "-", "ms": None, "n": 0}
    stat, q = ("p99", 99) if n >= 100 else ("p90", 90) if n >= 10 else ("max", 100)
    return {"stat": stat, "ms": float(np.percentile(np.asarray(values_s) * 1000, q)), "n": n}


class CorpusCursor:
    """Consecutive, non-overlapping windows of the default corpus (about 113,000 tokens of the pydoc
    topics): every prompt handed out is text no earlier prompt of the run contained, so a prefix cache
    finds nothing in it but what real text shares. A run that needs more text than the corpus holds
    stops with a message instead of silently reusing prompts."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids = corpus_token_ids(tokenizer)
        self.position = 0

    @property
    def remaining(self) -> int:
        return len(self.ids) - self.position

    def take(self, length: int) -> list[int]:
        if length > self.remaining:
            raise SystemExit(
                f"the corpus ({len(self.ids)} tokens) has no fresh text left for another {length}-token "
                "prompt: ask for fewer requests, rounds or shorter prompts"
            )
        window = self.ids[self.position : self.position + length]
        self.position += length
        return window

    def prompts(self, count: int, length: int) -> list[list[int]]:
        """`count` token-id prompts of exactly `length` tokens (for the in-process engine)."""
        return [self.take(length) for _ in range(count)]

    def requests(self, count: int, prompt_len: int, output_len: int) -> list[BenchRequest]:
        """`count` text prompts that the tokenizer encodes to exactly `prompt_len` tokens (for HTTP)."""
        # text_of_length may need a few tokens past the cut to land on an exact length.
        return [
            BenchRequest(
                prompt=text_of_length(self.tokenizer, self.take(prompt_len + 8), prompt_len),
                max_tokens=output_len,
                prompt_tokens=prompt_len,
            )
            for _ in range(count)
        ]


def subject_names(ap: argparse.ArgumentParser, text: str, known: Iterable[str]) -> list[str]:
    """--subjects' comma-separated names, each one of `known` (else the parser's usage error)."""
    names, known = text.split(","), list(known)
    if unknown := set(names) - set(known):
        ap.error(f"--subjects takes {', '.join(known)}, not {', '.join(sorted(unknown))}")
    return names


def peer_installed(engine: str) -> bool:
    env, venv = PEER_PYTHONS[engine]
    return bool(os.environ.get(env)) or (ROOT / venv / "bin" / "python").exists()


@dataclass(frozen=True)
class ServeSubject:
    """One server a benchmark measures: `llmopt serve` with these arguments (a model, --engine, flags)."""

    label: str
    args: list[str]
    served_name: str = SERVED

    def command(self, port: int) -> list[str]:
        """Its command line; and, for the server about to start, a KV disk tier of its own (in the
        environment it inherits): `llmopt serve` keeps prefix blocks on disk across restarts, so without
        it a fresh server would start warm with what an earlier round or run left, where its peers
        start cold (benchmarks/kv_disk_tier.py measures that warm start on purpose)."""
        os.environ[KV_DIR_ENV] = fresh_kv_dir()
        return llmopt_serve_argv(port, [*self.args, "--served-model-name", self.served_name])


KV_DIR_ENV = "LLMOPT_KV_DIR"  # llmopt/engine/kv_disk_store.py's; spelled out: importing it loads torch


def fresh_kv_dir() -> str:
    """An empty folder for one server's KV disk tier, removed when the benchmark exits."""
    folder = tempfile.mkdtemp(prefix="llmopt-bench-kv-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


@dataclass
class Rows:
    """Each subject's result of every round, in the order the subjects were listed."""

    rounds: dict[str, list[dict]] = field(default_factory=dict)

    def add(self, label: str, result: dict) -> None:
        self.rounds.setdefault(label, []).append(result)

    def best(self, label: str, key: str) -> dict:
        return min(self.rounds[label], key=lambda r: r[key])

    def median(self, label: str) -> dict:
        """The median over rounds of each number the first round holds (with two rounds, their mean)."""
        rounds = self.rounds[label]
        return {
            key: statistics.median(r[key] for r in rounds)
            for key, value in rounds[0].items()
            if isinstance(value, int | float) and all(r.get(key) is not None for r in rounds)
        }

    def values(self, label: str, key: str) -> list[float]:
        return [r[key] for r in self.rounds[label]]
