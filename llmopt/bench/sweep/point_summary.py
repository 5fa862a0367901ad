"""A point's summary, the line summary.json keeps for it: its runs' records pooled into one set of
figures (request_metrics.py), with several runs each headline metric's mean and interval over them
(repeats.py), the multi-turn figures (session_metrics.py), what the server said of itself during it
(server_metrics.py), the client's self-check, saturation and what the serving machine spent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmopt.bench.load.client import Target
from llmopt.bench.load.load_point import Measured, client_fields
from llmopt.bench.load.saturation import saturation_fields
from llmopt.bench.load.session import pooled_tools
from llmopt.bench.measure.request_metrics import summarize_results
from llmopt.bench.measure.session_metrics import summarize_sessions
from llmopt.bench.measure.token_cost import decode_read_fields, token_cost_fields
from llmopt.bench.observe.server_metrics import summarize_samples
from llmopt.bench.schema import PointSummary
from llmopt.bench.sweep.matrix import Cell, point_key
from llmopt.bench.sweep.point_runs import measure
from llmopt.bench.sweep.repeats import repeat_summary
from llmopt.bench.workload import SESSION_WORKLOADS

if TYPE_CHECKING:
    from llmopt.bench.servers.server_spec import ServerSpec
    from llmopt.bench.sweep.sweep_state import Sweep


def run_cell(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None, index: int, cell: Cell
) -> PointSummary:
    """Run one load point of one server (--num-runs times) and return its summary: the runs' records
    pooled, and with several runs each headline metric's mean and confidence interval (repeats.py)."""
    measured = measure(sweep, target, server_name, spec, index, cell, range(sweep.config.load.num_runs))
    return summarize_runs(sweep, target, server_name, spec, cell, measured)


def summarize_runs(
    sweep: Sweep, target: Target, server_name: str, spec: ServerSpec | None, cell: Cell, measured: Measured
) -> PointSummary:
    """A point's summary from its runs: their records pooled, and with several runs each headline
    metric's mean and confidence interval over them (repeats.py)."""
    config, runs = sweep.config, measured.runs
    prompt_len, output_len, point = cell
    records = [r for run in runs for r in run.result.records]
    wall = sum(run.result.wall_s for run in runs)
    summary = summarize_results([run.result for run in runs], sweep.slo, config.load.percentiles)
    if spec is not None:
        summary["spec"] = measured.spec
    if config.workload.kind in SESSION_WORKLOADS:
        planned = {s: n for run in runs for s, n in run.planned_turns.items()}
        summary.update(summarize_sessions(records, wall, planned, config.load.percentiles))
        summary["tools"] = pooled_tools([run.result.tools for run in runs])
    if len(runs) > 1:
        summary["repeats"] = repeat_summary([[r.result] for r in runs], sweep.slo, config.load.percentiles)
    summary.update(
        {
            "key": point_key(server_name, *cell),
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
            **decode_read_fields([run.result.machine for run in runs], summary["itl_ms"]["median"]),
        }
    )
    return PointSummary.from_json(summary)
