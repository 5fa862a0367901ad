"""A bench run: the matrix of server configs x workloads x load points, run point by point.

Every finished request is appended to the run's records at once and every finished point to its
summaries (see rundir.py), so a crash or Ctrl-C keeps all finished work and `--resume` continues with
the points not yet done. Local server configs (`[[serve]]` in a recipe) are started with `llmopt serve`
on a free port and stopped by pid, also when interrupted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from llmopt.bench.client import Target
from llmopt.bench.config import BenchConfig, BenchError, ServerSpec
from llmopt.bench.launcher import LocalServer, llmopt_serve_env
from llmopt.bench.metrics import parse_slo, summarize
from llmopt.bench.resume import check_resumable
from llmopt.bench.rundir import RunDir, machine_info
from llmopt.bench.runner import LoadPoint, run_point
from llmopt.bench.server_stats import scrape_spec_counters, spec_delta
from llmopt.bench.workload import count_tokens, make_requests

# (prompt length, output length, load point): one point of a server's matrix
Cell = tuple[int, int, LoadPoint]

# on_point_start(key, point) returns the callback that sees each of the point's finished records.
PointStart = Callable[[str, LoadPoint], Callable]


@dataclass
class Sweep:
    """What every point of a run shares."""

    config: BenchConfig
    run: RunDir
    tokenizer: object
    settings: dict
    slo: dict[str, float]
    records_out: IO[str]
    points: list[dict]  # every finished point of the run, old and new, in order
    done_keys: set[str]  # the points finished before this session (on resume)
    on_point_start: PointStart | None = None
    on_point_done: Callable[[dict], None] | None = None


def run_sweep(
    config: BenchConfig,
    run_dir: Path,
    resume: bool,
    tokenizer,
    on_point_start: PointStart | None = None,
    on_point_done: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every point not yet done; return all point summaries of the run (old and new)."""
    config.validate()
    run = RunDir(run_dir)
    recorded = config.recorded()
    done = open_run(run, resume, recorded)
    settings = {
        "config": recorded,
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
    }
    targets: list[tuple[str, ServerSpec | None]] = [(s.name, s) for s in config.servers] or [
        ("endpoint", None)
    ]
    with run.open_records() as records_out:
        sweep = Sweep(
            config=config,
            run=run,
            tokenizer=tokenizer,
            settings=settings,
            slo=parse_slo(config.slo),
            records_out=records_out,
            points=done[:],
            done_keys={p["key"] for p in done},
            on_point_start=on_point_start,
            on_point_done=on_point_done,
        )
        for server_name, spec in targets:
            run_server(sweep, server_name, spec)
    return sweep.points


def open_run(run: RunDir, resume: bool, config: dict) -> list[dict]:
    """Make the run folder; on resume check that `config` (as recorded) is the run's, return its
    finished points and drop the records of the others."""
    if run.holds_files() and not resume:
        raise BenchError(
            f"{run.path} already holds a run: pass --resume to continue it, or another --run-name"
        )
    run.path.mkdir(parents=True, exist_ok=True)
    summary = run.read_summary() if resume else {"settings": {}, "points": []}
    check_resumable(summary["settings"].get("config") or {}, config)
    done = summary["points"]
    run.keep_records_of({p["key"] for p in done})
    return done


def run_server(sweep: Sweep, server_name: str, spec: ServerSpec | None) -> None:
    """The points of one target not yet done; a local server is started for them and stopped after."""
    config = sweep.config
    matrix: list[Cell] = [
        (pl, ol, lp) for pl in config.prompt_lens for ol in config.output_lens for lp in config.load_points()
    ]
    # A point's place in the matrix seeds its prompts, so a resumed run sends what the first would have.
    todo = [
        (index, cell)
        for index, cell in enumerate(matrix)
        if point_key(server_name, *cell) not in sweep.done_keys
    ]
    if not todo:
        return
    log = sweep.run.server_log(server_name)
    server = None
    if spec is not None:
        server = LocalServer(
            spec.command, ready_timeout_s=600, log_path=log, env=llmopt_serve_env(spec.api_key)
        )
    # A local server's own key, if its args give one, else ours (sent to a server that may ignore it).
    api_key = (spec.api_key if spec else None) or config.api_key
    try:
        if server is not None:
            server.wait_ready()
        endpoint = server.url + "/v1" if server else config.endpoint
        model = config.model or first_model(endpoint, api_key)
        target = Target(
            endpoint,
            model,
            config.api,
            api_key,
            config.ignore_eos,
            config.request_timeout,
            config.connection_reuse,
        )
        for index, cell in todo:
            summary = run_cell(sweep, target, server_name, spec, index, cell)
            sweep.points.append(summary)
            sweep.run.write_summaries(sweep.points, sweep.settings)
            if sweep.on_point_done:
                sweep.on_point_done(summary)
    finally:
        if server is not None:
            server.stop()


def run_cell(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None, index: int, cell: Cell
) -> dict:
    """Run one load point of one server and return its summary."""
    config, tokenizer = sweep.config, sweep.tokenizer
    prompt_len, output_len, point = cell
    key = point_key(server_name, *cell)
    # Fresh prompts for every point (and for its warm-up), so that no point is served from
    # prefix-cache entries that an earlier point or the warm-up left behind.
    point_seed = config.seed + 7919 * index
    requests = make_requests(config, tokenizer, prompt_len, output_len, point_seed)
    if point.warmup:
        point.warmup_requests = make_requests(
            config, tokenizer, prompt_len, output_len, point_seed + 1, point.warmup
        )
    progress = sweep.on_point_start(key, point) if sweep.on_point_start else None
    count = functools.partial(count_tokens, tokenizer) if tokenizer is not None else None
    local = spec is not None  # only a local llmopt server is asked for its speculation counters
    before = scrape_spec_counters(target.endpoint) if local else None
    result = asyncio.run(run_point(target, requests, point, sweep.records_out, key, progress, count))
    summary = summarize(result.records, result.wall_s, sweep.slo, config.percentiles)
    if before is not None:
        summary["spec"] = spec_delta(before, scrape_spec_counters(target.endpoint))
    summary.update(
        {
            "key": key,
            "server": server_name,
            "model": target.model,
            "endpoint": target.endpoint,
            "prompt_len": prompt_len,
            "output_len": output_len,
            "load": point.label,
            "concurrency": point.concurrency,
            "request_rate": point.request_rate,
            "server_args": spec.recorded_args() if spec else None,
            "stopped_early": result.stopped_early,
        }
    )
    return summary


def first_model(endpoint: str, api_key: str | None) -> str:
    """The first model that `endpoint`/models lists: what to ask for when --model is not given."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(endpoint.rstrip("/") + "/models", headers=headers, timeout=30)
        r.raise_for_status()
        body = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BenchError(f"cannot list models at {endpoint}/models ({exc}); pass --model") from None
    models = body.get("data") or body.get("models") or []
    if not models:
        raise BenchError(f"{endpoint}/models lists no model; pass --model")
    return models[0].get("id") or models[0].get("name")


def point_key(server: str, prompt_len: int, output_len: int, point: LoadPoint) -> str:
    """A point's identity in a run: what --resume matches finished points by."""
    return f"{server}|prompt={prompt_len}|output={output_len}|{point.label}"
