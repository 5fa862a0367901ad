"""A bench run: the matrix of server configs x workloads x load points, run point by point.

Every finished request is appended to the run's records at once and every finished point to its
summaries (see rundir.py), so a crash or Ctrl-C keeps all finished work and `--resume` continues with
the points not yet done. Local server configs (`[[serve]]` in a recipe) are started with `llmopt serve`
on a free port and stopped by pid, also when interrupted. With `rounds` the configs take turns, round
by round (rounds.py); otherwise each config runs all its points in one start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from llmopt.bench.bench_error import BenchError
from llmopt.bench.client import Target
from llmopt.bench.config import BenchConfig, ServerSpec
from llmopt.bench.conversation import Conversation
from llmopt.bench.habit import Habit
from llmopt.bench.launcher import LocalServer
from llmopt.bench.load_point import LoadPoint, PointResult, client_fields
from llmopt.bench.machine_meter import machine_meter
from llmopt.bench.prefix_cache import cache_warnings, reset_prefix_cache
from llmopt.bench.quantized_serve import prepare_servers
from llmopt.bench.repeats import repeat_stats
from llmopt.bench.request_metrics import parse_slo, summarize
from llmopt.bench.resume import check_resumable
from llmopt.bench.rounds import (
    Measured,
    Run,
    finished_rounds,
    finished_runs,
    round_entry,
    round_repeats,
    total_spec,
)
from llmopt.bench.rundir import RunDir, machine_info
from llmopt.bench.runner import run_point, run_sessions
from llmopt.bench.saturation import saturation_fields
from llmopt.bench.search import run_search
from llmopt.bench.server_metrics import MetricsSampler, summarize_samples
from llmopt.bench.server_stats import scrape_spec_counters, spec_delta
from llmopt.bench.session_metrics import summarize_sessions
from llmopt.bench.steady_state import steady_state
from llmopt.bench.stop_on_saturation import skip_reason
from llmopt.bench.token_cost import token_cost_fields
from llmopt.bench.token_count import TokenCounter, tokenize_url
from llmopt.bench.workload import (
    REPEATING_WORKLOADS,
    SESSION_WORKLOADS,
    count_tokens,
    make_conversations,
    make_requests,
    random_prompts,
)

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
    on_point_skipped: Callable[[str, str], None] | None = None  # (key, why): --stop-on-saturation


def run_sweep(
    config: BenchConfig,
    run_dir: Path,
    resume: bool,
    tokenizer,
    on_point_start: PointStart | None = None,
    on_point_done: Callable[[dict], None] | None = None,
    on_point_skipped: Callable[[str, str], None] | None = None,
) -> list[dict]:
    """Run every point not yet done; return all point summaries of the run (old and new)."""
    config.validate()
    for server in config.servers:  # every peer installed, before a run folder or server is made
        server.check_engine(installed=True)
    run = RunDir(run_dir)
    recorded = config.recorded()
    done = open_run(run, resume, recorded)
    settings = {
        "config": recorded,
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
    }
    # Quantized configs are served from checkpoints made (or found in the cache) before any point runs.
    cache = Path(config.quantized_cache) if config.quantized_cache else None
    servers, quantized = prepare_servers(config.servers, cache)
    if quantized:
        settings["quantization"] = quantized
    targets: list[tuple[str, ServerSpec | None]] = [(s.name, s) for s in servers] or [("endpoint", None)]
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
            on_point_skipped=on_point_skipped,
        )
        if config.rounds > 1:
            run_rounds(sweep, targets)
        else:
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
    run.keep_records_of({p["key"] for p in done}, finished_runs(run.read_rounds()))
    return done


def run_server(sweep: Sweep, server_name: str, spec: ServerSpec | None) -> None:
    """The points of one target not yet done; a local server is started for them and stopped after."""
    config = sweep.config
    if config.goodput_search:
        # Probes depend on the results of the earlier ones: a resumed search replays those it has.
        with serving(sweep, server_name, spec) as target:
            run_searches(sweep, target, server_name, spec)
        return
    # A point's place in the matrix seeds its prompts, so a resumed run sends what the first would have.
    todo = [
        (index, entry)
        for index, entry in enumerate(matrix(config))
        if point_key(server_name, *entry.cell) not in sweep.done_keys
    ]
    if not todo:
        return
    with serving(sweep, server_name, spec) as target:
        for index, entry in todo:
            if skipped(sweep, server_name, entry.cell):
                continue
            summary = run_cell(entry_sweep(sweep, entry), target, server_name, spec, index, entry.cell)
            if entry.habit is not None:
                summary.update(habit_fields(config, server_name, entry))
            finish_point(sweep, summary)


def skipped(sweep: Sweep, server_name: str, cell: Cell) -> bool:
    """With --stop-on-saturation, whether a lower load of the cell's series saturated (stop_on_saturation.py):
    the point is then not run, and the run's settings (`skipped`) and `on_point_skipped` say why."""
    reason = skip_reason(sweep.points, server_name, cell) if sweep.config.stop_on_saturation else None
    if reason is None:
        return False
    key = point_key(server_name, *cell)
    sweep.settings.setdefault("skipped", []).append({"key": key, "reason": reason})
    sweep.run.write_summaries(sweep.points, sweep.settings)
    if sweep.on_point_skipped:
        sweep.on_point_skipped(key, reason)
    return True


def entry_sweep(sweep: Sweep, entry: MatrixEntry) -> Sweep:
    """What a matrix entry runs with: a habit's points with its settings (prompt length spread,
    connection reuse), the others with the run's."""
    if entry.habit is None:
        return sweep
    return dataclasses.replace(sweep, config=sweep.config.habit_config(entry.habit))


def run_rounds(sweep: Sweep, targets: list[tuple[str, ServerSpec | None]]) -> None:
    """Round 1 of every server config, each started, benched and stopped in turn, then round 2 of
    every one, ... (rounds.py); a resumed run skips the rounds it has."""
    entries = list(enumerate(matrix(sweep.config)))
    kept = finished_rounds(sweep.run.read_rounds(), sweep.run.read_records(), sweep.done_keys)
    for round_ in range(sweep.config.rounds):
        for server_name, spec in targets:
            todo = []
            for index, entry in entries:
                key = point_key(server_name, *entry.cell)
                if key not in sweep.done_keys and round_ not in kept.get(key, {}):
                    todo.append((index, entry))
            if not todo:
                continue
            with serving(sweep, server_name, spec) as target:
                for index, entry in todo:
                    run_round(sweep, target, (server_name, spec), index, entry, round_, kept)


def run_round(
    sweep: Sweep,
    target: Target,
    server: tuple[str, ServerSpec | None],
    index: int,
    entry: MatrixEntry,
    round_: int,
    kept: dict[str, dict[int, Measured]],
) -> None:
    """One round of one point, kept in the run folder; after its last round, the point's summary."""
    server_name, spec = server
    key = point_key(server_name, *entry.cell)
    cell_sweep = entry_sweep(sweep, entry)
    repeats = round_repeats(round_, sweep.config.num_runs)
    measured = measure(cell_sweep, target, server_name, spec, index, entry.cell, repeats)
    sweep.run.append_round(round_entry(key, round_, measured))
    rounds = kept.setdefault(key, {})
    rounds[round_] = measured
    if len(rounds) < sweep.config.rounds:
        return
    summary = summarize_rounds(
        cell_sweep, target, server_name, spec, entry.cell, [rounds[r] for r in sorted(rounds)]
    )
    if entry.habit is not None:
        summary.update(habit_fields(sweep.config, server_name, entry))
    finish_point(sweep, summary)


def summarize_rounds(
    sweep: Sweep,
    target: Target,
    server_name: str,
    spec: ServerSpec | None,
    cell: Cell,
    rounds: list[Measured],
) -> dict:
    """A point's summary over its rounds: every round's records pooled, and each headline metric's
    value in each round with their mean, spread and interval (repeats.py, over rounds, not runs)."""
    config = sweep.config
    runs = [run for measured in rounds for run in measured.runs]
    summary = summarize_runs(sweep, target, server_name, spec, cell, Measured(runs, total_spec(rounds)))
    per_round = [
        summarize_results([run.result for run in m.runs], sweep.slo, config.percentiles) for m in rounds
    ]
    summary["repeats"] = {**repeat_stats(per_round), "over": "rounds"}
    summary["rounds"] = len(rounds)
    return summary


@dataclass
class MatrixEntry:
    """A point of a server's matrix: a baseline cell, or a habit's change to one (`base`)."""

    cell: Cell
    habit: Habit | None = None
    base: Cell | None = None


def matrix(config: BenchConfig) -> list[MatrixEntry]:
    """The baseline's cells (prompt x output length x load point), then each habit's: every baseline
    cell it applies to, with its one change (the baseline's places, and so its seeds, stay as they were)."""
    base: list[Cell] = [
        (pl, ol, lp) for pl in config.prompt_lens for ol in config.output_lens for lp in config.load_points()
    ]
    entries = [MatrixEntry(cell) for cell in base]
    for habit in config.habits:
        entries += [
            MatrixEntry((pl, ol, habit.point(lp)), habit, (pl, ol, lp))
            for pl, ol, lp in base
            if habit.applies_to(lp)
        ]
    return entries


def habit_fields(config: BenchConfig, server_name: str, entry: MatrixEntry) -> dict:
    """What a habit point's summary says of its habit: its name, what it changed from what, and the
    baseline point it is compared with (report/client_habits.py)."""
    assert entry.habit is not None and entry.base is not None
    return {
        "habit": entry.habit.name,
        "habit_changes": entry.habit.changes(config, entry.base[2]),
        "baseline_key": point_key(server_name, *entry.base),
    }


def finish_point(sweep: Sweep, summary: dict) -> None:
    sweep.points.append(summary)
    sweep.run.write_summaries(sweep.points, sweep.settings)
    if sweep.on_point_done:
        sweep.on_point_done(summary)


@contextlib.contextmanager
def serving(sweep: Sweep, server_name: str, spec: ServerSpec | None) -> Iterator[Target]:
    """The target to send to: the endpoint, or a local server started here (and stopped after)."""
    config = sweep.config
    server = None
    if spec is not None:
        log = sweep.run.server_log(server_name)
        server = LocalServer(spec.command, ready_timeout_s=600, log_path=log, env=spec.env())
    # A local server's own key, if its args give one, else ours (sent to a server that may ignore it).
    api_key = (spec.api_key if spec else None) or config.api_key
    try:
        if server is not None:
            server.wait_ready()
        endpoint = server.url + "/v1" if server else config.endpoint
        model = config.model or first_model(endpoint, api_key)
        yield Target(
            endpoint,
            model,
            config.api,
            api_key,
            config.ignore_eos,
            config.request_timeout,
            config.connection_reuse,
            server_pid=server.pid if server is not None else None,
        )
    finally:
        if server is not None:
            server.stop()


def run_searches(sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None) -> None:
    """The goodput search for each prompt and output length: every probe a point of the run; the
    answers go into the run's settings ("search") and each probe's summary says if it is the answer."""
    config = sweep.config
    done = {p["key"]: p for p in sweep.points}
    for number, (prompt_len, output_len) in enumerate(
        itertools.product(config.prompt_lens, config.output_lens)
    ):

        def measure(
            load: float, probe: int, prompt_len=prompt_len, output_len=output_len, number=number
        ) -> dict:
            cell = (prompt_len, output_len, config.search_point(load))
            key = point_key(server_name, *cell)
            if key in done:
                return done[key]
            summary = run_cell(sweep, target, server_name, spec, 1000 * number + probe, cell)
            finish_point(sweep, summary)
            return summary

        result = run_search(config.search(), measure)
        answer = next((p for p in result.probes if p["search"]["answer"]), None)
        sweep.settings.setdefault("search", []).append(
            {
                "server": server_name,
                "prompt_len": prompt_len,
                "output_len": output_len,
                "slo": config.goodput_search,
                "percentile": config.search_percentile,
                "answer": result.answer,
                "answer_key": answer["key"] if answer else None,
                "probes": [p["key"] for p in result.probes],
            }
        )
        sweep.run.write_summaries(sweep.points, sweep.settings)


def run_cell(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None, index: int, cell: Cell
) -> dict:
    """Run one load point of one server (--num-runs times) and return its summary: the runs' records
    pooled, and with several runs each headline metric's mean and confidence interval (repeats.py)."""
    measured = measure(sweep, target, server_name, spec, index, cell, range(sweep.config.num_runs))
    return summarize_runs(sweep, target, server_name, spec, cell, measured)


def measure(
    sweep: Sweep,
    target: Target,
    server_name: str,
    spec: ServerSpec | None,
    index: int,
    cell: Cell,
    repeats: range,
) -> Measured:
    """The runs of a point numbered `repeats` (each number seeds its run's prompts)."""
    key = point_key(server_name, *cell)
    target = dataclasses.replace(
        target, stream=cell[2].stream, connection_reuse=sweep.config.connection_reuse
    )
    local = spec is not None  # only a local llmopt server is asked for its speculation counters
    before = scrape_spec_counters(target.endpoint) if local else None
    runs = [run_once(sweep, target, key, index, cell, repeat) for repeat in repeats]
    grown = spec_delta(before, scrape_spec_counters(target.endpoint)) if before is not None else None
    return Measured(runs, grown)


def summarize_runs(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None, cell: Cell, measured: Measured
) -> dict:
    """A point's summary from its runs: their records pooled, and with several runs each headline
    metric's mean and confidence interval over them (repeats.py)."""
    config, runs = sweep.config, measured.runs
    prompt_len, output_len, point = cell
    key = point_key(server_name, *cell)
    records = [r for run in runs for r in run.result.records]
    wall = sum(run.result.wall_s for run in runs)
    summary = summarize_results([run.result for run in runs], sweep.slo, config.percentiles)
    if spec is not None:
        summary["spec"] = measured.spec
    if config.workload in SESSION_WORKLOADS:
        planned = {s: n for run in runs for s, n in run.planned_turns.items()}
        summary.update(summarize_sessions(records, wall, planned, config.percentiles))
        tools = [run.result.tools for run in runs]
        summary["tools"] = next((t for t in tools if t != "sent"), tools[0])  # a refusal is what to say
    if len(runs) > 1:
        per_run = [summarize_results([r.result], sweep.slo, config.percentiles) for r in runs]
        summary["repeats"] = repeat_stats(per_run)
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
            "sessions": point.sessions,
            "session_rate": point.session_rate,
            "replay_speed": point.replay_speed,
            "stream": point.stream,
            "server_args": spec.recorded_args() if spec else None,
            "stopped_early": next((r.result.stopped_early for r in runs if r.result.stopped_early), None),
            "prefix_cache_reset": runs[0].reset,
            "warnings": list(dict.fromkeys(w for run in runs for w in run.warnings)),
            "server_metrics": summarize_samples([(run.samples, run.result.wall_s) for run in runs]),
            **client_fields([run.result for run in runs]),
            **saturation_fields(point, [run.result for run in runs]),
            **token_cost_fields([run.result.machine for run in runs], summary["output_tokens"]),
        }
    )
    return summary


def summarize_results(
    results: list[PointResult], slo: dict[str, float], percentiles: tuple[float, ...]
) -> dict:
    """The figures of runs of a point: their records pooled; latencies and throughputs over each run's
    steady state (steady_state.py)."""
    records = [r for result in results for r in result.records]
    wall = sum(result.wall_s for result in results)
    steady = steady_state([(result.records, result.wall_s) for result in results])
    return summarize(records, wall, slo, percentiles, steady)


def run_once(sweep: Sweep, target: Target, key: str, index: int, cell: Cell, repeat: int) -> Run:
    """One run of a point, after resetting the prefix cache."""
    config, tokenizer = sweep.config, sweep.tokenizer
    prompt_len, output_len, point = cell
    if config.rounds > 1:  # its records say which run they are of (rounds.py: --resume keeps finished rounds)
        point = dataclasses.replace(point, run=repeat)
        cell = (prompt_len, output_len, point)
    # Fresh prompts for every point, run and warm-up, so that none is served from prefix-cache entries
    # that an earlier one left behind; a point's place in the matrix seeds them (resume sends the same).
    seed = config.seed + 7919 * index + 104729 * repeat
    # Counts a server's answer leaves out: from its /tokenize where it has one, else the local tokenizer.
    count = TokenCounter(
        functools.partial(count_tokens, tokenizer) if tokenizer is not None else None,
        tokenize_url(target.endpoint),
        target.model,
        target.headers(),
    )
    reset, warnings = cache_hygiene(config, target, index + repeat, point)
    planned: dict[int, int] = {}
    with MetricsSampler(target.endpoint.rstrip("/").removesuffix("/v1"), config.metrics_interval) as sampler:
        if config.workload in SESSION_WORKLOADS:
            result, planned = run_sessions_cell(sweep, target, key, cell, seed, count, repeat)
        else:
            requests = make_requests(config, tokenizer, prompt_len, output_len, seed)
            if point.warmup:
                point.warmup_requests = make_requests(
                    config, tokenizer, prompt_len, output_len, seed + 1, point.warmup
                )
            progress = sweep.on_point_start(key, point) if sweep.on_point_start else None
            meter = machine_meter(target)
            result = asyncio.run(
                run_point(target, requests, point, sweep.records_out, key, progress, count, meter)
            )
        ended = time.perf_counter()
    # Sample times count from the point's start, as its records' do (else from where it must have been).
    samples = sampler.samples(result.started if result.started is not None else ended - result.wall_s)
    sweep.run.append_server_metrics([{"point": key, "run": repeat, **s.to_json()} for s in samples])
    return Run(result, planned, reset, warnings, samples, repeat)


def cache_hygiene(
    config: BenchConfig, target: Target, earlier: int, point: LoadPoint
) -> tuple[bool | None, list[str]]:
    """Before a run: reset the server's prefix cache (None: not asked to), and say what may still serve
    it from a cache (prefix_cache.py); `earlier` counts the points and runs this server ran before."""
    reset = None
    if config.reset_prefix_cache:
        reset = reset_prefix_cache(target.endpoint, target.api_key, min(60.0, target.timeout_s))
    repeating = config.workload in REPEATING_WORKLOADS
    file_warmup = config.workload == "file" and point.warmup > 0
    return reset, cache_warnings(repeating, earlier, bool(reset), file_warmup)


def run_sessions_cell(
    sweep: Sweep, target: Target, key: str, cell: Cell, seed: int, count, repeat: int
) -> tuple[PointResult, dict[int, int]]:
    """A multi-turn run: about --num-requests turns' worth of sessions (at least as many as run at
    once), warmed up with single prompts of a first turn's length; its result and each session's turns."""
    config, tokenizer = sweep.config, sweep.tokenizer
    turn_len, output_len, point = cell
    width = point.sessions or 1
    wanted = max(width, math.ceil(config.num_requests / config.turns))
    conversations = enough(
        make_conversations(config, tokenizer, turn_len, output_len, seed, wanted), config.num_requests, width
    )
    warm = None
    if point.warmup:
        warm = random_prompts(tokenizer, point.warmup, config.system_len + turn_len, output_len, seed + 5)
    planned = sum(len(c.turns) for c in conversations)
    progress = None
    if sweep.on_point_start:
        progress = sweep.on_point_start(key, dataclasses.replace(point, num_requests=planned))
    first = repeat * len(conversations)  # each run's sessions numbered apart
    meter = machine_meter(target)
    result = asyncio.run(
        run_sessions(
            target, conversations, point, sweep.records_out, key, progress, count, warm, first, meter
        )
    )
    return result, {first + i: len(c.turns) for i, c in enumerate(conversations)}


def enough(conversations: list[Conversation], num_requests: int, width: int) -> list[Conversation]:
    """The first conversations that hold `num_requests` turns, and at least `width` of them (fewer
    when there are fewer)."""
    out, turns = [], 0
    for conv in conversations:
        if turns >= num_requests and len(out) >= width:
            break
        out.append(conv)
        turns += len(conv.turns)
    return out


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
