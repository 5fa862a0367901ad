"""Rounds: with `rounds = N` (a recipe's [load]) the server configs take turns — round 1 of every config,
each started, benched and stopped in turn, then round 2 of every config, and so on — so that a drift of
the machine over a run (heat, a neighbour's load) falls on every engine alike, not on whichever ran
last. A point's round r runs its repeats r*num_runs ... (r+1)*num_runs - 1, so its prompts are fresh in
every round and the same for every config within one (the sweep seeds them from the repeat). The point's
summary, written after its last round, pools the rounds' records and gives each headline metric's
value per round, mean, spread and interval (repeats.py), as --num-runs does for runs.

A finished round is kept in the run folder (rounds.jsonl: what its runs measured besides their records,
which requests.jsonl holds tagged with their run), so --resume finishes a point with the rounds it has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmopt.bench.load.client import Target
from llmopt.bench.load.load_point import Measured, PointResult, Run
from llmopt.bench.load.self_check import ClientLoad
from llmopt.bench.observe.machine_meter import MachineUse
from llmopt.bench.observe.server_metrics import ServerSample
from llmopt.bench.observe.server_stats import SPEC_COUNTERS, spec_delta
from llmopt.bench.schema import PointSummary, Repeats, RequestRecord
from llmopt.bench.servers.server_lifecycle import serving
from llmopt.bench.sweep.matrix import Cell, MatrixEntry, habit_fields, matrix, point_key
from llmopt.bench.sweep.point_runs import measure
from llmopt.bench.sweep.point_summary import summarize_runs
from llmopt.bench.sweep.repeats import repeat_summary

if TYPE_CHECKING:
    from llmopt.bench.servers.server_spec import ServerSpec
    from llmopt.bench.sweep.sweep_state import Sweep


def round_repeats(round_: int, num_runs: int) -> range:
    """The point's runs that round `round_` (from 0) runs: the next num_runs of them."""
    return range(round_ * num_runs, (round_ + 1) * num_runs)


def round_entry(key: str, round_: int, measured: Measured) -> dict:
    """A finished round as rounds.jsonl keeps it: its runs without their records."""
    runs = []
    for run in measured.runs:
        result = {k: v for k, v in dataclasses.asdict(run.result).items() if k != "records"}
        runs.append(
            {
                "repeat": run.repeat,
                "result": result,
                "planned_turns": {str(k): v for k, v in run.planned_turns.items()},
                "reset": run.reset,
                "warnings": run.warnings,
                "samples": [s.to_json() for s in run.samples],
            }
        )
    return {"point": key, "round": round_, "spec": measured.spec, "runs": runs}


def measured_from(entry: dict, records: list[RequestRecord]) -> Measured:
    """A round read back from its rounds.jsonl entry and the run's records (requests.jsonl's)."""
    runs = []
    for data in entry["runs"]:
        mine = [r for r in records if r.point == entry["point"] and r.run == data["repeat"]]
        result = dict(data["result"])
        result["client"] = [ClientLoad(**load) for load in result.get("client") or []]
        result["machine"] = MachineUse(**result["machine"]) if result.get("machine") else None
        runs.append(
            Run(
                PointResult(mine, **result),
                {int(k): v for k, v in data["planned_turns"].items()},
                data["reset"],
                data["warnings"],
                [ServerSample.from_json(s) for s in data["samples"]],
                data["repeat"],
            )
        )
    return Measured(runs, entry.get("spec"))


def finished_rounds(
    entries: list[dict], records: list[RequestRecord], done: set[str]
) -> dict[str, dict[int, Measured]]:
    """{point key: {round: Measured}} of the rounds that finished for points not yet done."""
    out: dict[str, dict[int, Measured]] = {}
    for entry in entries:
        if entry["point"] not in done:
            out.setdefault(entry["point"], {})[entry["round"]] = measured_from(entry, records)
    return out


def finished_runs(entries: list[dict]) -> frozenset[tuple[str, int]]:
    """(point key, run number) of every run of a finished round: the records a resume keeps."""
    return frozenset((e["point"], run["repeat"]) for e in entries for run in e["runs"])


def total_spec(rounds: list[Measured]) -> dict[str, float] | None:
    """The speculation counters' growth over every round (each round's server counted from 0)."""
    grown = [m.spec for m in rounds if m.spec]
    return spec_delta({}, {k: sum(s.get(k) or 0 for s in grown) for k in SPEC_COUNTERS}) if grown else None


def run_rounds(sweep: Sweep, targets: list[tuple[str, ServerSpec | None]]) -> Iterator[PointSummary]:
    """Round 1 of every server config, each started, benched and stopped in turn, then round 2 of
    every one, ...; a resumed run skips the rounds it has. Yields each point's summary after its last
    round, while its server still runs (the sweep keeps it in the run before the next point)."""
    entries = list(enumerate(matrix(sweep.config)))
    kept = finished_rounds(sweep.run.read_rounds(), sweep.run.read_records(), sweep.done_keys)
    for round_ in range(sweep.config.load.rounds):
        for server_name, spec in targets:
            todo = []
            for index, entry in entries:
                key = point_key(server_name, *entry.cell)
                if key not in sweep.done_keys and round_ not in kept.get(key, {}):
                    todo.append((index, entry))
            if not todo:
                continue
            with serving(sweep.config.target, sweep.config.load, sweep.run, server_name, spec) as target:
                for index, entry in todo:
                    summary = run_round(sweep, target, (server_name, spec), index, entry, round_, kept)
                    if summary is not None:
                        yield summary


def run_round(
    sweep: Sweep,
    target: Target,
    server: tuple[str, ServerSpec | None],
    index: int,
    entry: MatrixEntry,
    round_: int,
    kept: dict[str, dict[int, Measured]],
) -> PointSummary | None:
    """One round of one point, kept in the run folder; after its last round, the point's summary
    (None before)."""
    server_name, spec = server
    key = point_key(server_name, *entry.cell)
    cell_sweep = sweep.for_entry(entry)
    repeats = round_repeats(round_, sweep.config.load.num_runs)
    measured = measure(cell_sweep, target, server_name, spec, index, entry.cell, repeats)
    sweep.run.append_round(round_entry(key, round_, measured))
    rounds = kept.setdefault(key, {})
    rounds[round_] = measured
    if len(rounds) < sweep.config.load.rounds:
        return None
    summary = summarize_rounds(
        cell_sweep, target, server_name, spec, entry.cell, [rounds[r] for r in sorted(rounds)]
    )
    if entry.habit is not None:
        summary = dataclasses.replace(summary, **habit_fields(sweep.config, server_name, entry))
    return summary


def summarize_rounds(
    sweep: Sweep,
    target: Target,
    server_name: str,
    spec: ServerSpec | None,
    cell: Cell,
    rounds: list[Measured],
) -> PointSummary:
    """A point's summary over its rounds: every round's records pooled, and each headline metric's
    value in each round with their mean, spread and interval (repeats.py, over rounds, not runs)."""
    runs = [run for measured in rounds for run in measured.runs]
    measured = Measured(runs, total_spec(rounds))
    summary = summarize_runs(sweep, target, server_name, spec, cell, measured)
    per_round = [[run.result for run in m.runs] for m in rounds]
    repeats = repeat_summary(per_round, sweep.slo, sweep.config.load.percentiles)
    summary.repeats = Repeats.from_json({**repeats, "over": "rounds"})
    summary.rounds = len(rounds)
    return summary
