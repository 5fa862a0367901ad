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
from dataclasses import dataclass, field

from llmopt.bench.client import RequestRecord
from llmopt.bench.load_point import PointResult
from llmopt.bench.machine_meter import MachineUse
from llmopt.bench.self_check import ClientLoad
from llmopt.bench.server_metrics import ServerSample
from llmopt.bench.server_stats import SPEC_COUNTERS, spec_delta

RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestRecord))


@dataclass
class Run:
    """One run of a point (a point runs --num-runs times, in each of its rounds)."""

    result: PointResult
    planned_turns: dict[int, int]  # multi-turn runs: each session's number of turns
    reset: bool | None  # whether the prefix cache was reset before it (None: not asked to)
    warnings: list[str]
    samples: list[ServerSample] = field(default_factory=list)  # the server's /metrics during it
    repeat: int = 0  # its number among the point's runs: what seeds its prompts


@dataclass
class Measured:
    """The runs of a point on one server start: all of them, or one round's."""

    runs: list[Run]
    spec: dict[str, float] | None = None  # the speculation counters' growth over them (server_stats.py)


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


def measured_from(entry: dict, records: list[dict]) -> Measured:
    """A round read back from its rounds.jsonl entry and the run's records (requests.jsonl lines)."""
    runs = []
    for data in entry["runs"]:
        mine = [
            RequestRecord(**{k: v for k, v in r.items() if k in RECORD_FIELDS})
            for r in records
            if r.get("point") == entry["point"] and r.get("run") == data["repeat"]
        ]
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
    entries: list[dict], records: list[dict], done: set[str]
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
