"""Soak: one `llmopt serve` (default model) kept at saturation for --minutes by more clients than it
runs sequences, with a mix of streamed and non-streamed completions and chats, short and long outputs,
clients that leave (a stream closed after a few chunks, a JSON request given up by timeout), and every
--bench-every minutes an `llmopt bench` run SIGKILLed mid-point and then continued with --resume.

Every request the soak clients send ends as exactly one of: finished (2xx and complete), failed (an
error status or an error event while the client was still there), disconnected (we left on purpose),
or lost (not left by us and never fully answered: a connection error, no answer within --answer-timeout,
a stream cut without [DONE]). Lost must be 0, and once the server is idle every KV block must be free.

Prints a table, writes results/soak.json, exits 1 on a lost request, a leaked KV block or a bench run
that its --resume did not complete.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--clients 24] [--bench-every 5]
    .venv/bin/python benchmarks/soak.py --minutes 1      # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from llmopt.bench import LocalServer, llmopt_server, parse_metrics
from llmopt.corpus import default_text
from results import write_result

MAX_REQUESTS_PER_CLIENT = 1_000_000  # the soak is bounded by time; this only bounds the loop by count
MAX_BENCH_CYCLES = 100
SAMPLE_EVERY_S = 5.0
BENCH_KILL_AFTER_RECORDS = 5  # finished requests before the SIGKILL: mid-point, with others in flight
BENCH_KILL_WAIT_S = 180  # SIGKILL by then even if fewer have finished
BENCH_RESUME_TIMEOUT_S = 900
IDLE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Plan:
    """One soak request: what it asks for and whether (and how) its client leaves early."""

    api: str  # "completions" or "chat"
    stream: bool
    max_tokens: int
    ignore_eos: bool
    temperature: float
    prompt: str
    leave: str | None = None  # None, "after_chunks" (streams) or "timeout" (JSON)
    leave_after_chunks: int = 0
    give_up_s: float = 0.0

    @property
    def kind(self) -> str:
        leave = f", leaves ({self.leave})" if self.leave else ""
        return f"{self.api} {'stream' if self.stream else 'json'}{leave}"

    def body(self) -> dict:
        body: dict = {"max_tokens": self.max_tokens, "temperature": self.temperature, "stream": self.stream}
        body["ignore_eos"] = self.ignore_eos
        if self.stream and self.max_tokens % 2:  # about half the streams ask for usage, as SDKs may
            body["stream_options"] = {"include_usage": True}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        return body


def make_plan(rng: random.Random, words: list[str], leave_share: float) -> Plan:
    api = rng.choice(["completions", "chat"])
    stream = rng.random() < 0.5
    leave = None
    if rng.random() < leave_share:
        leave = "after_chunks" if stream else "timeout"
    # A client that leaves asks for a long output, so that it leaves while its request still runs.
    long = leave is not None or rng.random() < 0.3
    max_tokens = rng.randint(64, 256) if long else rng.randint(1, 32)
    n_words = rng.randint(100, 300) if rng.random() < 0.2 else rng.randint(3, 40)
    start = rng.randrange(len(words) - n_words)
    return Plan(
        api=api,
        stream=stream,
        max_tokens=max_tokens,
        ignore_eos=long or rng.random() < 0.5,  # long outputs really are long
        temperature=rng.choice([0.0, 0.7, 1.0]),
        prompt=" ".join(words[start : start + n_words]),
        leave=leave,
        leave_after_chunks=rng.randint(0, 3),
        give_up_s=rng.uniform(0.2, 2.0),
    )


@dataclass
class Tally:
    sent: int = 0
    finished: int = 0
    failed: int = 0
    disconnected: int = 0
    lost: int = 0
    sent_by_kind: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)  # reason -> count
    losses: list[str] = field(default_factory=list)  # the first few, described

    def record(self, outcome: str, detail: str | None, plan: Plan) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome == "failed":
            self.failures[(detail or "")[:160]] += 1
        elif outcome == "lost" and len(self.losses) < 20:
            self.losses.append(f"{plan.kind}, max_tokens {plan.max_tokens}: {detail}")

    @property
    def in_flight(self) -> int:
        return self.sent - self.finished - self.failed - self.disconnected - self.lost


def check_json(data: dict) -> str | None:
    """Why a 200 JSON body is not a complete answer, or None."""
    choices = data.get("choices")
    if not choices or any(c.get("finish_reason") not in ("stop", "length") for c in choices):
        return f"a 200 without finished choices: {json.dumps(data)[:160]}"
    if "usage" not in data:
        return "a 200 without usage"
    return None


async def run_json(client: httpx.AsyncClient, url: str, plan: Plan, answer_timeout_s: float) -> tuple:
    # A client that gives up waits give_up_s for the whole answer: httpx's read timeout is the wait for
    # the first byte here, since a JSON answer is written at once when complete.
    wait = plan.give_up_s if plan.leave == "timeout" else answer_timeout_s
    try:
        r = await client.post(url, json=plan.body(), timeout=httpx.Timeout(wait, connect=10))
    except httpx.ReadTimeout:
        if plan.leave == "timeout":
            return "disconnected", None  # the connection is closed: the server must abort the request
        return "lost", f"no answer within {answer_timeout_s:.0f} s"
    if r.status_code != 200:
        return "failed", f"{r.status_code} {r.text[:140]}"
    try:
        problem = check_json(r.json())
    except ValueError:
        problem = f"a 200 that is not JSON: {r.text[:140]}"
    return ("failed", problem) if problem else ("finished", None)


async def run_stream(client: httpx.AsyncClient, url: str, plan: Plan, answer_timeout_s: float) -> tuple:
    timeout = httpx.Timeout(answer_timeout_s, connect=10)  # between chunks
    try:
        async with client.stream("POST", url, json=plan.body(), timeout=timeout) as r:
            if r.status_code != 200:
                return "failed", f"{r.status_code} {(await r.aread())[:140].decode(errors='replace')}"
            chunks, finished_choices = 0, set()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    if not finished_choices:
                        return "failed", "[DONE] before any choice finished"
                    return "finished", None
                try:
                    event = json.loads(line[len("data: ") :])
                except json.JSONDecodeError:
                    return "failed", f"an event that is not JSON: {line[:140]}"
                if "error" in event:
                    return "failed", f"error event: {json.dumps(event['error'])[:140]}"
                finished_choices |= {c["index"] for c in event.get("choices", []) if c.get("finish_reason")}
                chunks += 1
                if plan.leave == "after_chunks" and chunks > plan.leave_after_chunks:
                    # Leaving the `async with` closes the connection mid-stream: the server notices
                    # when its next write fails and must abort the request.
                    return "disconnected", None
            return "lost", f"the stream ended without [DONE] after {chunks} chunks"
    except httpx.ReadTimeout:
        return "lost", f"nothing for {answer_timeout_s:.0f} s"


async def send(client: httpx.AsyncClient, base_url: str, plan: Plan, answer_timeout_s: float) -> tuple:
    url = base_url + ("/v1/chat/completions" if plan.api == "chat" else "/v1/completions")
    try:
        if plan.stream:
            return await run_stream(client, url, plan, answer_timeout_s)
        return await run_json(client, url, plan, answer_timeout_s)
    except httpx.HTTPError as exc:  # the connection broke: the server closed it, or it died
        return "lost", f"{type(exc).__name__}: {exc}"[:200]


async def soak_client(
    index: int, client: httpx.AsyncClient, base_url: str, args, words: list[str], stop_at: float, tally: Tally
) -> None:
    rng = random.Random(args.seed * 10_000 + index)
    for _ in range(MAX_REQUESTS_PER_CLIENT):
        if time.monotonic() >= stop_at:
            return
        plan = make_plan(rng, words, args.leave_share)
        tally.sent += 1
        tally.sent_by_kind[plan.kind] += 1
        outcome, detail = await send(client, base_url, plan, args.answer_timeout)
        tally.record(outcome, detail, plan)


def record_count(path: Path) -> int:
    """Finished requests in a bench run's requests.jsonl (a torn last line is not one)."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_bytes().splitlines() if line.endswith(b"}"))


@dataclass
class BenchCycle:
    name: str
    api: str
    started_s: float  # since the soak began
    killed: bool = False
    records_at_kill: int = 0
    resume_exit: int | None = None  # None: killed after BENCH_RESUME_TIMEOUT_S
    successful: int = 0
    failed: int = 0
    seconds: float = 0.0

    def ok(self, num_requests: int) -> bool:
        return self.resume_exit == 0 and self.successful == num_requests and self.failed == 0


async def bench_cycle(base_url: str, workdir: Path, index: int, args, started_s: float) -> BenchCycle:
    """`llmopt bench` against the soaked server, SIGKILLed once a few requests have finished, then run
    again with --resume, which must finish the point."""
    cycle = BenchCycle(name=f"soak-{index}", api="chat" if index % 2 else "completions", started_s=started_s)
    command = [
        sys.executable, "-m", "llmopt.cli", "bench", "--endpoint", base_url + "/v1", "--api", cycle.api,
        "--concurrency", str(args.bench_concurrency), "--num-requests", str(args.bench_requests),
        "--prompt-len", "64", "--output-len", "32", "--run-name", cycle.name, "--results-dir", str(workdir),
    ]  # fmt: skip
    start = time.monotonic()
    records = workdir / cycle.name / "requests.jsonl"
    with open(workdir / f"{cycle.name}.log", "ab") as log:
        proc = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
        deadline = time.monotonic() + BENCH_KILL_WAIT_S
        while proc.returncode is None and time.monotonic() < deadline:
            if record_count(records) >= BENCH_KILL_AFTER_RECORDS:
                break
            with contextlib.suppress(asyncio.TimeoutError):  # not yet the builtin on Python 3.10
                await asyncio.wait_for(proc.wait(), 0.2)
        cycle.killed = proc.returncode is None
        if cycle.killed:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
        cycle.records_at_kill = record_count(records)
        resumed = await asyncio.create_subprocess_exec(*command, "--resume", stdout=log, stderr=log)
        try:
            cycle.resume_exit = await asyncio.wait_for(resumed.wait(), BENCH_RESUME_TIMEOUT_S)
        except asyncio.TimeoutError:
            resumed.kill()
            await resumed.wait()
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        point = json.loads((workdir / cycle.name / "summary.json").read_text())["points"][0]
        cycle.successful, cycle.failed = point["successful"], point["failed"]
    cycle.seconds = time.monotonic() - start
    return cycle


async def bench_cycles(base_url: str, workdir: Path, args, t0: float, stop_at: float) -> list[BenchCycle]:
    cycles: list[BenchCycle] = []
    every_s = args.bench_every * 60
    # The first run comes early enough that even a one-minute smoke run has one.
    next_at = t0 + min(60.0, (stop_at - t0) / 4)
    while next_at < stop_at and len(cycles) < MAX_BENCH_CYCLES:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        cycles.append(await bench_cycle(base_url, workdir, len(cycles) + 1, args, time.monotonic() - t0))
        next_at += every_s
    return cycles


@dataclass
class Samples:
    """What the server said about itself every few seconds under load, and its memory."""

    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    kv_used: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)


async def metrics(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    return parse_metrics((await client.get(base_url + "/metrics", timeout=30)).text)


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


async def sample(
    client: httpx.AsyncClient, base_url: str, pid: int, stop_at: float, samples: Samples
) -> None:
    while time.monotonic() < stop_at:
        with contextlib.suppress(httpx.HTTPError):
            m = await metrics(client, base_url)
            samples.running.append(m["llmopt:num_requests_running"])
            samples.waiting.append(m["llmopt:num_requests_waiting"])
            samples.kv_used.append(m["llmopt:kv_blocks_used"])
        samples.rss_mb.append(rss_mb(pid))
        await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, stop_at - time.monotonic())))


async def wait_idle(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    """The metrics once nothing runs or waits and no KV block is used, or after IDLE_TIMEOUT_S."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        m = await metrics(client, base_url)
        busy = m["llmopt:num_requests_running"] or m["llmopt:num_requests_waiting"]
        if not busy and not m["llmopt:kv_blocks_used"] or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.5)


async def soak(server: LocalServer, args, workdir: Path) -> dict:
    words = default_text().split()
    tally, samples = Tally(), Samples()
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        before = await metrics(client, server.url)
        rss_start = rss_mb(server.proc.pid)
        t0 = time.monotonic()
        stop_at = t0 + args.minutes * 60
        clients = [
            asyncio.create_task(soak_client(i, client, server.url, args, words, stop_at, tally))
            for i in range(args.clients)
        ]
        sampler = asyncio.create_task(sample(client, server.url, server.proc.pid, stop_at, samples))
        cycles = await bench_cycles(server.url, workdir, args, t0, stop_at)
        # Clients start nothing after stop_at; what they have in flight ends within answer_timeout.
        done, pending = await asyncio.wait(clients, timeout=args.answer_timeout + 30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # a bug in this script surfaces here, not as a quietly lost client
        await sampler
        wall_s = time.monotonic() - t0
        # Requests still in flight after that long were never answered.
        tally.lost += tally.in_flight
        idle = await wait_idle(client, server.url)
        rss_end = rss_mb(server.proc.pid)
        samples.rss_mb.append(rss_end)
    return {
        "minutes": args.minutes,
        "wall_seconds": round(wall_s, 1),  # the load, then the last bench run and the drain
        "server_log_errors": server_log_errors(server),
        "clients": args.clients,
        "server_args": server_args(args),
        "requests": {
            "sent": tally.sent,
            "finished": tally.finished,
            "failed": tally.failed,
            "disconnected": tally.disconnected,
            "lost": tally.lost,
        },
        "sent_by_kind": dict(sorted(tally.sent_by_kind.items())),
        "failures": dict(tally.failures.most_common(20)),
        "losses": tally.losses,
        "bench_cycles": [asdict(c) | {"ok": c.ok(args.bench_requests)} for c in cycles],
        "rss_mb": {
            "start": round(rss_start, 1),
            "end": round(rss_end, 1),
            "peak": round(max(samples.rss_mb), 1),
        },
        "kv_blocks": {
            "pool": int(idle["llmopt:kv_blocks_total"]),
            "free_when_idle": int(idle["llmopt:kv_blocks_total"] - idle["llmopt:kv_blocks_used"]),
            "expected_pool": args.num_kv_blocks,
            "max_used": max(samples.kv_used, default=None),
        },
        "load": load_summary(samples, before, idle, args.max_num_seqs),
    }


def load_summary(samples: Samples, before: dict, idle: dict, max_num_seqs: int) -> dict:
    """How saturated the server was, and what it did over the soak (its counters' growth)."""
    running = samples.running or [0.0]

    def grew(name: str) -> float:
        return idle[f"llmopt:{name}"] - before[f"llmopt:{name}"]

    return {
        "mean_running": round(sum(running) / len(running), 2),
        "at_max_num_seqs_share": round(sum(r >= max_num_seqs for r in running) / len(running), 3),
        # Saturated: more work than it runs (requests wait), whether sequences or KV blocks are the limit.
        "queued_share": round(sum(w > 0 for w in samples.waiting) / max(len(samples.waiting), 1), 3),
        "max_waiting": max(samples.waiting, default=None),
        "running_when_idle": idle["llmopt:num_requests_running"],
        "waiting_when_idle": idle["llmopt:num_requests_waiting"],
        "generated_tokens": grew("generation_tokens_total"),
        "preemptions": grew("num_preemptions_total"),
        "server_successes": grew("request_success_total"),
    }


def server_log_errors(server: LocalServer) -> int:
    """ERROR lines in the server's log: a failed request, or a step that failed, is logged there."""
    return sum(" ERROR " in line for line in server.log_path.read_text(errors="replace").splitlines())


def server_args(args) -> list[str]:
    return ["--max-num-seqs", str(args.max_num_seqs), "--num-kv-blocks", str(args.num_kv_blocks)]


def verdict(result: dict) -> list[str]:
    """What makes the soak fail; empty when it passed."""
    problems = []
    if result["requests"]["lost"]:
        problems.append(f"{result['requests']['lost']} request(s) lost")
    kv = result["kv_blocks"]
    if kv["free_when_idle"] != kv["pool"] or kv["pool"] != kv["expected_pool"]:
        problems.append(f"KV blocks leaked: {kv['free_when_idle']} of {kv['pool']} free when idle")
    bad = [c["name"] for c in result["bench_cycles"] if not c["ok"]]
    if bad:
        problems.append(f"bench runs not completed by --resume: {', '.join(bad)}")
    return problems


def table(result: dict) -> Table:
    args = " ".join(result["server_args"])
    t = Table(title=f"soak: {result['minutes']:g} min, {result['clients']} clients, llmopt serve {args}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    r = result["requests"]
    for name in ("sent", "finished", "failed", "disconnected", "lost"):
        t.add_row(f"requests {name}", str(r[name]))
    for reason, count in list(result["failures"].items())[:3]:
        t.add_row(f"  failed: {reason[:70]}", str(count))
    for c in result["bench_cycles"]:
        what = f"killed at {c['records_at_kill']} done" if c["killed"] else "finished before the kill"
        t.add_row(
            f"bench {c['name']} ({c['api']}, at {c['started_s']:.0f} s)",
            f"{what}; --resume exit {c['resume_exit']}, {c['successful']} ok / {c['failed']} failed",
        )
    rss = result["rss_mb"]
    t.add_row(
        "server RSS start / end / peak (MiB)", f"{rss['start']:.0f} / {rss['end']:.0f} / {rss['peak']:.0f}"
    )
    kv = result["kv_blocks"]
    t.add_row("KV blocks free when idle / pool", f"{kv['free_when_idle']} / {kv['pool']}")
    load = result["load"]
    t.add_row(
        "mean running / samples with requests waiting", f"{load['mean_running']} / {load['queued_share']:.0%}"
    )
    t.add_row("max waiting / max KV blocks used", f"{load['max_waiting']} / {kv['max_used']}")
    t.add_row("ERROR lines in the server log", str(result["server_log_errors"]))
    t.add_row("tokens generated / preemptions", f"{load['generated_tokens']:.0f} / {load['preemptions']:.0f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to keep the load on (fractions ok)")
    ap.add_argument("--clients", type=int, default=24, help="soak clients, each one request at a time")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--num-kv-blocks", type=int, default=256)
    ap.add_argument("--leave-share", type=float, default=0.15, help="share of requests whose client leaves")
    ap.add_argument("--answer-timeout", type=float, default=300, help="s without an answer: lost")
    ap.add_argument("--bench-every", type=float, default=5.0, help="minutes between bench kill/resume runs")
    ap.add_argument("--bench-concurrency", type=int, default=8)
    ap.add_argument("--bench-requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    console = Console(width=150)

    workdir = Path(tempfile.mkdtemp(prefix="llmopt-soak-"))
    command = server_args(args)
    console.print(f"llmopt serve {' '.join(command)}; bench runs and the server log in {workdir}")
    server = llmopt_server(command, ready_timeout_s=180, log_path=workdir / "server.log")
    with server:
        result = asyncio.run(soak(server, args, workdir))
    problems = verdict(result)
    result["problems"] = problems
    soak_table = table(result)
    console.print(soak_table)
    for loss in result["losses"][:10]:
        console.print(f"[red]lost:[/red] {loss}", markup=True, highlight=False)
    path = write_result("soak", result, [soak_table])
    console.print(f"wrote {path}")
    if problems:
        console.print(f"[red]FAILED: {'; '.join(problems)}[/red] (logs kept in {workdir})")
        sys.exit(1)
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when something needs looking into


if __name__ == "__main__":
    main()
