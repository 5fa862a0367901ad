"""How much load one `llmopt bench` process can drive, and how much TTFT it adds.

A minimal streaming server (raw asyncio, keep-alive, answers at once with two SSE chunks and [DONE])
runs in a process of its own. The bench's own client drives it:
- the highest request rate: a closed loop at growing concurrency, tiny streamed requests;
- the TTFT it adds: at concurrency 1 the stub answers in microseconds, so the measured TTFT is the
  bench's own overhead plus loopback (an upper bound).
Baseline in the same run: the same requests sent by a bare aiohttp loop with no timing or parsing.
- how far `--workers` scales it: the same closed loop (--workers-concurrency, default 64) from 1, 2 and 4
  client processes, with the ratio of each to 1 worker and each point's self-check (the busiest client
  loop's CPU share, its loop lag p99, whether the client was the limit). The stub runs in --stub-procs
  processes on one port (SO_REUSEPORT; default half the cores, at most 4, so that it is not the limit
  first); on a 2-core machine the client processes and the stub share two cores, and the ratio says so.
Prints the tables and writes results/bench_overhead.json.

    .venv/bin/python benchmarks/bench_overhead.py [--concurrency 1,8,32,64] [--requests 3000]
        [--workers 1,2,4] [--workers-concurrency 64] [--stub-procs N]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time

import aiohttp
from harness import MachineLoad, tail_latency
from rich.console import Console
from rich.table import Table

from llmopt.bench import BenchRequest, LoadPoint, Target, client_summary, free_port, run_point, summarize
from results import write_result

CHUNK = b'data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\n'
LAST = (
    b'data: {"choices":[{"index":0,"text":"!","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\ndata: [DONE]\n\n'
)


def stub_server(port: int, ready) -> None:
    """HTTP/1.1 with chunked transfer encoding: just enough of a streaming completions server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith(b"GET"):
                    body = b'{"data":[{"id":"stub"}]}'
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body)
                    )
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
                writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
                for part in (CHUNK, LAST):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        # reuse_port: several stub processes listen on one port, the kernel spreads the connections.
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096, reuse_port=True)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def bare_loop(url: str, concurrency: int, total: int) -> float:
    """Baseline: the same requests with nothing but aiohttp (read the body, no timing, no parsing)."""
    body = {"model": "stub", "prompt": "x", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        count = 0

        async def worker() -> None:
            nonlocal count
            while count < total:
                count += 1
                async with session.post(url, json=body) as resp:
                    await resp.read()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument(
        "--requests", type=int, default=3000, help="requests per point (a third at concurrency 1)"
    )
    ap.add_argument("--warmup", type=int, default=50, help="requests before each point, not counted")
    ap.add_argument("--workers", default="1,2,4", help="client processes of the scaling points ('' for none)")
    ap.add_argument("--workers-concurrency", type=int, default=64, help="concurrency of the scaling points")
    ap.add_argument("--stub-procs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 2)))
    args = ap.parse_args()
    if args.requests < 3 or args.warmup < 0 or args.stub_procs < 1 or args.workers_concurrency < 1:
        ap.error(
            "--requests must be at least 3, --warmup at least 0, --stub-procs and concurrency at least 1"
        )
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
        args.workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError:
        ap.error("--concurrency and --workers are comma-separated whole numbers")
    if any(w < 1 for w in args.workers):
        ap.error("--workers counts processes: each at least 1")
    return args


def workers_rows(args: argparse.Namespace, target: Target, requests: list[BenchRequest]) -> list[dict]:
    """The scaling points: one closed loop at --workers-concurrency from each number of workers."""
    rows = []
    for workers in args.workers:
        point = LoadPoint(
            concurrency=args.workers_concurrency,
            num_requests=args.requests,
            warmup=args.warmup,
            workers=workers,
        )
        result = asyncio.run(run_point(target, requests, point))
        s = summarize(result.records, result.wall_s)
        assert s["failed"] == 0, s["errors"]
        client = client_summary(result.client, result.workers)
        rows.append(
            {
                "workers": workers,
                "processes": result.workers,
                "req_s": s["request_throughput"],
                "ttft_ms_median": s["ttft_ms"]["median"],
                "client_cpu": client["cpu"],
                "loop_lag_ms_p99": client["loop_lag_ms"]["p99"],
                "client_limited": client["limited"],
            }
        )
    one = next((r["req_s"] for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["vs_1_worker"] = r["req_s"] / one if one else None
    return rows


def workers_table(rows: list[dict], load: MachineLoad, concurrency: int) -> Table:
    table = Table(
        title=load.title(f"--workers: the same closed loop (concurrency {concurrency}) from N processes")
    )
    for col in (
        "workers",
        "bench req/s",
        "vs 1 worker",
        "TTFT median ms",
        "busiest loop CPU",
        "loop lag p99 ms",
    ):
        table.add_column(col, justify="right")
    table.add_column("client-limited")
    for r in rows:
        ratio = "-" if r["vs_1_worker"] is None else f"{r['vs_1_worker']:.2f}x"
        table.add_row(
            str(r["workers"]),
            f"{r['req_s']:.0f}",
            ratio,
            f"{r['ttft_ms_median']:.3f}",
            f"{r['client_cpu']:.0%}",
            f"{r['loop_lag_ms_p99']:.2f}",
            "yes" if r["client_limited"] else "no",
        )
    return table


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console)
    port = free_port()
    stubs = []
    for _ in range(args.stub_procs):
        ready = mp.Event()
        stubs.append(mp.Process(target=stub_server, args=(port, ready), daemon=True))
        stubs[-1].start()
        ready.wait(10)
    endpoint = f"http://127.0.0.1:{port}/v1"
    target = Target(endpoint, "stub", api="completions")
    requests = [BenchRequest(prompt="x", max_tokens=2, prompt_tokens=1)]
    rows, scaling = [], []
    try:
        for index, concurrency in enumerate(args.concurrency):
            # Concurrency 1 sends one request at a time: a third as many keep its point as short as the rest.
            total = args.requests if concurrency > 1 else args.requests // 3
            point = LoadPoint(concurrency=concurrency, num_requests=total, warmup=args.warmup)
            # The two take turns going first (a warm stub or a cooled CPU favours neither); the bare loop
            # gets the bench's warm-up too, uncounted.
            for side in ("bench", "bare") if index % 2 == 0 else ("bare", "bench"):
                if side == "bench":
                    result = asyncio.run(run_point(target, requests, point))
                else:
                    asyncio.run(bare_loop(endpoint + "/completions", concurrency, max(1, args.warmup)))
                    bare = asyncio.run(bare_loop(endpoint + "/completions", concurrency, total))
            s = summarize(result.records, result.wall_s)
            assert s["failed"] == 0, s["errors"]
            rows.append(
                {
                    "concurrency": concurrency,
                    "bench_req_s": s["request_throughput"],
                    "bare_req_s": bare,
                    "ttft_ms_median": s["ttft_ms"]["median"],
                    "ttft_tail": tail_latency([r.ttft for r in result.records if r.ttft is not None]),
                }
            )
        scaling = workers_rows(args, target, requests)
    finally:
        for proc in stubs:
            proc.terminate()
    table = Table(
        title=load.title("llmopt bench client against a minimal streaming stub (one bench process)")
    )
    for col in (
        "concurrency",
        "bench req/s",
        "bare aiohttp req/s",
        "bench / bare",
        "TTFT median ms",
        "TTFT tail ms",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["concurrency"]),
            f"{r['bench_req_s']:.0f}",
            f"{r['bare_req_s']:.0f}",
            f"{r['bench_req_s'] / r['bare_req_s']:.2f}x",
            f"{r['ttft_ms_median']:.3f}",
            f"{r['ttft_tail']['ms']:.3f} ({r['ttft_tail']['stat']})",
        )
    console.print(table)
    tables = [table]
    if scaling:
        tables.append(workers_table(scaling, load, args.workers_concurrency))
        console.print(tables[-1])
    best = max((r["bench_req_s"] for r in rows), default=0.0)
    added = next((r["ttft_ms_median"] for r in rows if r["concurrency"] == 1), None)
    console.print(
        f"highest rate: {best:.0f} req/s; added TTFT at concurrency 1 (median, upper bound): "
        + ("not measured" if added is None else f"{added:.3f} ms")
    )
    summary = {
        "args": vars(args),
        "rows": rows,
        "workers_rows": scaling,
        "max_req_s": best,
        "added_ttft_ms": added,
    }
    write_result("bench_overhead", {**summary, **load.finish(console)}, tables)


if __name__ == "__main__":
    main()
