"""A bench run: the matrix of server configs x workloads x load points (matrix.py), run point by point.

Every finished request is appended to the run's records at once and every finished point to its
summaries (see rundir.py), so a crash or Ctrl-C keeps all finished work and `--resume` continues with
the points not yet done. Local server configs (`[[serve]]` in a recipe) are started with `llmopt serve`
on a free port and stopped by pid, also when interrupted (server_lifecycle.py). With `rounds` the configs
take turns, round by round (rounds.py); with a goodput search each length's probes are its points
(search.py); otherwise each config runs all its points in one start. A point's runs are point_runs.py's,
its summary point_summary.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.stop_on_saturation import skip_reason
from llmopt.bench.rundir import RunDir, machine_info
from llmopt.bench.schema import PointSummary, QuantizationRecord, RunSettings, RunSummary, SkippedPoint
from llmopt.bench.servers.quantized_serve import prepare_servers
from llmopt.bench.servers.server_lifecycle import serving
from llmopt.bench.slo import parse_slo
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.bench.sweep.matrix import Cell, habit_fields, matrix, point_key
from llmopt.bench.sweep.point_summary import run_cell
from llmopt.bench.sweep.resume import check_resumable
from llmopt.bench.sweep.rounds import finished_runs, run_rounds
from llmopt.bench.sweep.search import SearchAnswer, run_searches
from llmopt.bench.sweep.sweep_state import PointStart, Sweep


def run_sweep(
    config: BenchConfig,
    run_dir: Path,
    resume: bool,
    tokenizer,
    on_point_start: PointStart | None = None,
    on_point_done: Callable[[PointSummary], None] | None = None,
    on_point_skipped: Callable[[str, str], None] | None = None,
) -> list[PointSummary]:
    """Run every point not yet done; return all point summaries of the run (old and new)."""
    config.validate()
    for server in config.servers:  # every peer installed, before a run folder or server is made
        server.check_engine(installed=True)
    run = RunDir(run_dir)
    recorded = config.recorded()
    done = open_run(run, resume, recorded)
    settings = RunSettings(
        config=recorded,
        started=dt.datetime.now().isoformat(timespec="seconds"),
        machine=machine_info(),
    )
    # Quantized configs are served from checkpoints made (or found in the cache) before any point runs.
    cache = Path(config.target.quantized_cache) if config.target.quantized_cache else None
    servers, quantized = prepare_servers(config.servers, cache)
    if quantized:
        settings.quantization = {name: QuantizationRecord(record) for name, record in quantized.items()}
    targets: list[tuple[str, ServerSpec | None]] = [(s.name, s) for s in servers] or [("endpoint", None)]
    with run.open_records() as records_out:
        sweep = Sweep(
            config=config,
            run=run,
            tokenizer=tokenizer,
            settings=settings,
            slo=parse_slo(config.load.slo),
            records_out=records_out,
            points=done[:],
            done_keys={p.key for p in done},
            on_point_start=on_point_start,
        )
        told = Notices(on_point_done, on_point_skipped)
        if config.load.rounds > 1:
            for summary in run_rounds(sweep, targets):
                finish_point(sweep, told, summary)
        else:
            for server_name, spec in targets:
                run_server(sweep, told, server_name, spec)
    return sweep.points


@dataclass
class Notices:
    """What the caller (the CLI's progress) is told as the run goes. Only this module tells it: the
    rounds and the search below return what they finished, and the sweep keeps it and tells."""

    on_point_done: Callable[[PointSummary], None] | None = None
    on_point_skipped: Callable[[str, str], None] | None = None  # (key, why): --stop-on-saturation


def finish_point(sweep: Sweep, told: Notices, summary: PointSummary) -> None:
    """A finished point kept in the run (summary.json rewritten at once, so a crash keeps it)."""
    sweep.points.append(summary)
    sweep.run.write_summaries(sweep.points, sweep.settings)
    if told.on_point_done:
        told.on_point_done(summary)


def open_run(run: RunDir, resume: bool, config: dict) -> list[PointSummary]:
    """Make the run folder; on resume check that `config` (as recorded) is the run's, return its
    finished points and drop the records of the others."""
    if run.holds_files() and not resume:
        raise BenchError(
            f"{run.path} already holds a run: pass --resume to continue it, or another --run-name"
        )
    run.path.mkdir(parents=True, exist_ok=True)
    summary = run.read_summary() if resume else RunSummary()
    check_resumable(summary.settings.config, config)
    done = summary.points
    run.keep_records_of({p.key for p in done}, finished_runs(run.read_rounds()))
    return done


def run_server(sweep: Sweep, told: Notices, server_name: str, spec: ServerSpec | None) -> None:
    """The points of one target not yet done; a local server is started for them and stopped after."""
    config = sweep.config
    if config.load.goodput_search:
        # Probes depend on the results of the earlier ones: a resumed search replays those it has.
        with serving(config.target, config.load, sweep.run, server_name, spec) as target:
            for found in run_searches(sweep, target, server_name, spec):
                if isinstance(found, SearchAnswer):
                    sweep.settings.search = [*(sweep.settings.search or []), found.entry]
                    sweep.run.write_summaries(sweep.points, sweep.settings)
                else:
                    finish_point(sweep, told, found)
        return
    # A point's place in the matrix seeds its prompts, so a resumed run sends what the first would have.
    todo = [
        (index, entry)
        for index, entry in enumerate(matrix(config))
        if point_key(server_name, *entry.cell) not in sweep.done_keys
    ]
    if not todo:
        return
    with serving(config.target, config.load, sweep.run, server_name, spec) as target:
        for index, entry in todo:
            if skipped(sweep, told, server_name, entry.cell):
                continue
            summary = run_cell(sweep.for_entry(entry), target, server_name, spec, index, entry.cell)
            if entry.habit is not None:
                summary = dataclasses.replace(summary, **habit_fields(config, server_name, entry))
            finish_point(sweep, told, summary)


def skipped(sweep: Sweep, told: Notices, server_name: str, cell: Cell) -> bool:
    """With --stop-on-saturation, whether a lower load of the cell's series saturated (stop_on_saturation.py):
    the point is then not run, and the run's settings (`skipped`) and `on_point_skipped` say why."""
    reason = skip_reason(sweep.points, server_name, cell) if sweep.config.load.stop_on_saturation else None
    if reason is None:
        return False
    key = point_key(server_name, *cell)
    sweep.settings.skipped = [*(sweep.settings.skipped or []), SkippedPoint(key, reason)]
    sweep.run.write_summaries(sweep.points, sweep.settings)
    if told.on_point_skipped:
        told.on_point_skipped(key, reason)
    return True
