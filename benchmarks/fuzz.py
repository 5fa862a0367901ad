"""Schemathesis against a fresh `llmopt serve` (the fuzz test's cheap configuration), with more cases
than CI can afford: the whole coverage phase, then Hypothesis-drawn positive and negative bodies up to
--cases in all. The driver is tests/server/test_fuzz.py's. Afterwards the server must still answer
/health and a normal completion, and give every KV block back.

Prints a table (cases, responses by status class, 5xx, seconds) and every request that got a server
error, writes results/fuzz.json, and exits 1 on a server error, an unanswered request or a leak.

    .venv/bin/python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--workers 8] [--max-seconds 3600]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the driver lives with the test, in the `tests` package at the top

from results import write_result  # noqa: E402
from tests.conftest import API_KEY, LiveServer  # noqa: E402
from tests.server.test_fuzz import SERVER_ARGS, FuzzReport, run_fuzz  # noqa: E402


def after_checks(server: LiveServer) -> dict:
    """Is the server still whole: healthy, serving, and with every KV block free once idle?"""
    health = httpx.get(server.url + "/health", timeout=10).status_code
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    completion = httpx.post(server.url + "/v1/completions", headers=headers, json=body, timeout=60)
    m = server.wait_idle()
    total, used = int(m["llmopt:kv_blocks_total"]), int(m["llmopt:kv_blocks_used"])
    return {
        "health_status": health,
        "completion_status": completion.status_code,
        "kv_blocks_total": total,
        "kv_blocks_free": total - used,
        "requests_running": int(m["llmopt:num_requests_running"]),
        "requests_waiting": int(m["llmopt:num_requests_waiting"]),
    }


def table(report: FuzzReport, after: dict) -> Table:
    t = Table(title="schemathesis against llmopt serve")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("cases", str(report.cases))
    t.add_row("  coverage phase", str(report.coverage_cases))
    t.add_row("  fuzzing phase", str(report.fuzzing_cases))
    for status_class, count in report.status_classes().items():
        t.add_row(f"responses {status_class}", str(count))
    t.add_row("5xx (incl. streamed server errors)", str(len(report.server_errors)))
    t.add_row("no answer (connection error, timeout)", str(len(report.no_answer)))
    t.add_row("seconds", f"{report.seconds:.1f}")
    t.add_row("cases/s", f"{report.cases / report.seconds:.1f}" if report.seconds else "-")
    t.add_row("/health after", str(after["health_status"]))
    t.add_row("completion after", str(after["completion_status"]))
    t.add_row("KV blocks free / total after", f"{after['kv_blocks_free']} / {after['kv_blocks_total']}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000, help="cases in all (coverage phase included)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis' seed")
    ap.add_argument("--workers", type=int, default=8, help="requests in flight")
    ap.add_argument("--max-seconds", type=float, default=3600, help="send nothing new after this long")
    args = ap.parse_args()
    console = Console(width=150)

    console.print(f"llmopt serve {' '.join(a if a != API_KEY else '***' for a in SERVER_ARGS)} ...")
    with LiveServer(*SERVER_ARGS) as server:
        report = run_fuzz(server.url, API_KEY, args.cases, args.seed, args.workers, args.max_seconds)
        after = after_checks(server)
        log_tail = server.log_tail(15) if report.server_errors or report.no_answer else ""

    fuzz_table = table(report, after)
    console.print(fuzz_table)
    for answer, count in report.server_error_kinds().items():
        console.print(f"[red]{count} server error(s) answering[/red] {escape(answer)}", soft_wrap=True)
    # The shortest bodies first: the easiest to read and replay (results/fuzz.json has them all).
    for error in sorted(report.server_errors, key=lambda e: len(str(e["request"]["body"])))[:10]:
        console.print(f"[red]{error['status']}[/red] {escape(json.dumps(error['request']))}", soft_wrap=True)
    for lost in report.no_answer[:20]:
        console.print(f"[red]no answer[/red] {escape(json.dumps(lost['request']))}: {escape(lost['error'])}")
    if log_tail:
        console.print("server log (tail):", log_tail, markup=False, highlight=False)

    leaked = after["kv_blocks_free"] != after["kv_blocks_total"]
    healthy = after["health_status"] == 200 and after["completion_status"] == 200
    path = write_result(
        "fuzz",
        {
            **report.to_dict(),
            "requested_cases": args.cases,
            "workers": args.workers,
            "server_args": [a if a != API_KEY else "***" for a in SERVER_ARGS],
            "after": after,
            "kv_leaked": leaked,
            "machine": platform.machine(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
        [fuzz_table],
    )
    console.print(f"wrote {path}")
    if report.server_errors or report.no_answer or leaked or not healthy:
        sys.exit(1)


if __name__ == "__main__":
    main()
