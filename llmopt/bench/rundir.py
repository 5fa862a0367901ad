"""A bench run's folder: the one place that knows its file names and formats (what its records hold,
typed, is schema.py's).

    requests.jsonl       one JSON record per finished request, appended as it finishes
    summary.json         {"settings": ..., "points": [point summary, ...]}, rewritten after every point
    summary.csv          the same points as a table
    turns.csv            multi-turn runs: one row per point and turn index (TTFT, E2E, cached fraction)
    server_metrics.jsonl the server's /metrics sampled during each point (observe/server_metrics.py),
                         one JSON line per sample with its point's key and run, written as each run ends
    server-<name>.log    the output of each local server the run started
    rounds.jsonl         runs with rounds (sweep/rounds.py): one JSON line per finished round of a point,
                         what its runs measured besides their records, so that --resume can finish the
                         point with the rounds it already has
    report.html          the HTML report

A run killed mid-write leaves at most a torn last line in requests.jsonl (or server_metrics.jsonl):
reading drops it (that request never finished), so neither --resume nor the report fails on it. The
summaries are replaced atomically, so a crash leaves the previous ones whole.

The server's figures read back with today's names, also from a run written before them (RENAMED), and
a point's CPU or energy source with no reading is NOT_MEASURED: every reader of a run folder, the
report and --resume alike, gets them from here.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from llmopt.bench.redact import redact_args
from llmopt.bench.schema import Machine, PointSummary, RequestRecord, RunSettings, RunSummary
from llmopt.bench.slo import parse_slo
from llmopt.files import jsonl_records

RECORDS = "requests.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
TURNS_CSV = "turns.csv"
SERVER_METRICS = "server_metrics.jsonl"
ROUNDS = "rounds.jsonl"
REPORT = "report.html"

CSV_FIELDS = [
    "server",
    "prompt_len",
    "output_len",
    "load",
    "requests",
    "successful",
    "failed",
    "reconnects",
    "structured_valid",
    "structured_truncated",
    "structured_invalid",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "tokens_per_chunk",
    "goodput",
    # Over-saturation (saturation.py): the flag and what held
    "saturated",
    "saturation_reason",
    # What the serving machine spent (token_cost.py): CPU per 1k output tokens, cores, joules per token
    "server_cpu_s",
    "cpu_s_per_1k_tokens",
    "server_cores",
    "cpu_source",
    "energy_j",
    "joules_per_token",
    "energy_source",
    # The decode reads a point implies (token_cost.py): weight bytes a step over the ITL, and the machine's
    "decode_weight_bytes",
    "decode_read_gbs",
    "machine_read_gbs",
    "decode_read_share",
]
CSV_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
# Multi-turn points' columns, after the metrics: {column: (summary block, field, statistic or None)}.
SESSION_COLUMNS = {
    "sessions": (None, "sessions", None),
    "session_rate": (None, "session_rate", None),
    "sessions_completed": ("conversations", "completed", None),
    "sessions_failed": ("conversations", "failed", None),
    "turns_per_s": ("conversations", "turns_per_s", None),
    "conversation_ms_median": ("conversations", "conversation_ms", "median"),
}
# The client's self-check (self_check.py), last: its processes, busiest loop's CPU share, loop lag, flag.
CLIENT_COLUMNS = {
    "client_workers": ("client", "workers", None),
    "client_cpu": ("client", "cpu", None),
    "client_loop_lag_ms_p99": ("client", "loop_lag_ms", "p99"),
    "client_limited": (None, "client_limited", None),
}
# The steady state (steady_state.py): the successful requests whose latencies count, and all of them.
STEADY_COLUMNS = {
    "steady_kept": ("steady_state", "kept", None),
    "steady_of": ("steady_state", "of", None),
}
# A point's cpu_source / energy_source where its runs have no reading of the machine (runs written
# before the bench read it, a resumed round of one); token_cost.py writes it, the report shows it.
NOT_MEASURED = "not measured"
# Names the server's figures had in earlier runs (server_metrics.jsonl, rounds.jsonl, summary.json).
RENAMED = {
    "kv_usage": "kv_cache_usage",
    "kv_usage_mean": "kv_cache_usage_mean",
    "kv_usage_max": "kv_cache_usage_max",
    "prefix_hit_rate": "prefix_cache_hit_rate",
}
TURN_FIELDS = ["key", "turn", "requests", "successful", "prompt_tokens_mean", "cached_fraction"]
# A server's name becomes part of a file name (server-<name>.log): nothing in it may lead elsewhere.
SERVER_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def run_folder_name(recipe: Path | None, now: dt.datetime | None = None) -> str:
    """A run's folder when none is named: the time it started, after its recipe's name if it has one."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{recipe.stem}-{stamp}" if recipe else stamp


def check_server_name(name: object) -> None:
    """ValueError for a server name that could not safely be part of a file name in the run folder."""
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"server name {name!r}: server names may use letters, digits, '-', '_', '.' (no '..')"
        )


def renamed(figures: dict) -> dict:
    """`figures` (a sample, or a summary's server_metrics) with an earlier run's names made today's."""
    return {RENAMED.get(key, key): value for key, value in figures.items()}


def _todays_point(point: dict) -> dict:
    """A point summary as read back: its server_metrics under today's names."""
    if not point.get("server_metrics"):
        return point
    return {**point, "server_metrics": renamed(point["server_metrics"])}


def _todays_round(entry: dict) -> dict:
    """A rounds.jsonl entry as read back: its runs' server samples under today's names."""
    runs = [
        {**run, "samples": [renamed(s) for s in run["samples"]]} if "samples" in run else run
        for run in entry.get("runs", [])
    ]
    return {**entry, "runs": runs} if "runs" in entry else entry


@dataclass
class RunDir:
    path: Path

    @property
    def records(self) -> Path:
        return self.path / RECORDS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_JSON

    @property
    def summary_csv(self) -> Path:
        return self.path / SUMMARY_CSV

    @property
    def turns_csv(self) -> Path:
        return self.path / TURNS_CSV

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def server_metrics(self) -> Path:
        return self.path / SERVER_METRICS

    def append_server_metrics(self, lines: list[dict]) -> None:
        """Add one run's samples of the server's metrics (each a JSON object with its point's key)."""
        if not lines:
            return
        with open(self.server_metrics, "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
            f.flush()

    def read_server_metrics(self) -> list[dict]:
        """server_metrics.jsonl's samples, under today's names."""
        return [renamed(sample) for _, sample in self._lines(self.server_metrics)]

    @property
    def rounds(self) -> Path:
        return self.path / ROUNDS

    def append_round(self, entry: dict) -> None:
        """Add one finished round of a point (a JSON object with its point's key and its runs' numbers)."""
        with open(self.rounds, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()

    def read_rounds(self) -> list[dict]:
        """rounds.jsonl's entries, their server samples under today's names."""
        return [_todays_round(entry) for _, entry in self._lines(self.rounds)]

    def server_log(self, server: str) -> Path:
        check_server_name(server)
        return self.path / f"server-{server}.log"

    def is_run(self) -> bool:
        """Whether the folder holds a run with at least one finished point."""
        return self.summary.is_file()

    def holds_files(self) -> bool:
        return self.path.exists() and any(self.path.iterdir())

    def open_records(self) -> IO[str]:
        """requests.jsonl for appending (the caller writes one line per finished request)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return open(self.records, "a")  # noqa: SIM115 - the caller closes it

    def read_summary(self) -> RunSummary:
        """summary.json typed (schema.py), its points' server figures under today's names; empty when
        no point has finished."""
        if not self.summary.is_file():
            return RunSummary()
        try:
            data = json.loads(self.summary.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.summary}: not JSON ({exc.msg})") from None
        points = [_todays_point(p) for p in data.get("points", [])]
        return RunSummary.from_json({"settings": data.get("settings", {}), "points": points})

    def load_summaries(self) -> list[PointSummary]:
        return self.read_summary().points

    def write_summaries(self, points: list[PointSummary], settings: RunSettings) -> None:
        # Both texts first: a point that cannot be written leaves both files as they were, still a pair.
        summary = json.dumps(RunSummary(settings, points).to_json(), indent=2)
        table = summary_csv(points)
        turns = turns_csv(points)
        _replace(self.summary, summary)
        _replace(self.summary_csv, table)
        if turns is not None:
            _replace(self.turns_csv, turns)

    def read_records(self) -> list[RequestRecord]:
        """requests.jsonl's records, each with its point's key (and its run, where the point had several)."""
        return [RequestRecord.from_json(record) for _, record in self._record_lines()]

    def keep_records_of(self, keys: set[str], runs: frozenset[tuple[str, int]] = frozenset()) -> None:
        """On resume: drop the records (and server samples) of points that did not finish (they run
        again), but those of `runs` ((point key, run number): the finished rounds of unfinished points)."""

        def kept(record: dict) -> bool:
            return record.get("point") in keys or (record.get("point"), record.get("run")) in runs

        for path in (self.records, self.server_metrics):
            if path.is_file():
                lines = [line for line, record in self._lines(path) if kept(record)]
                _replace(path, "".join(line + "\n" for line in lines))

    def _record_lines(self) -> list[tuple[str, dict]]:
        return self._lines(self.records)

    def _lines(self, path: Path) -> list[tuple[str, dict]]:
        """(line, record) for each record in a JSONL file of the run, without a torn last line."""
        if not path.is_file():
            return []
        text = path.read_text()
        # Only the last line can be torn (every record is written and flushed whole, in order).
        body, _, tail = text.rpartition("\n")
        raw = body.splitlines()
        lines = [(raw[number - 1], record) for number, record in jsonl_records(path, body)]
        try:
            if tail.strip():
                lines.append((tail, json.loads(tail)))
        except json.JSONDecodeError:
            pass
        return lines


def summary_csv(points: list[PointSummary]) -> str:
    """The point summaries as CSV: the fields of CSV_FIELDS, then mean, median and each percentile of
    every latency metric (ttft_ms_mean, ..., e2e_ms_p99)."""
    stats = ["mean", "median"] + [k for k in points[0].ttft_ms if k.startswith("p")] if points else []
    metric_cols = [(m, s) for m in CSV_METRICS for s in stats]
    out = io.StringIO()
    writer = csv.writer(out)
    # Only a run with multi-turn points has their columns, so other runs' tables read as they did.
    sessions = list(SESSION_COLUMNS) if any(p.conversations is not None for p in points) else []
    sessions += list(CLIENT_COLUMNS) if any(p.client is not None for p in points) else []
    sessions += list(STEADY_COLUMNS) if any(p.steady_state is not None for p in points) else []
    writer.writerow(CSV_FIELDS + [f"{m}_{s}" for m, s in metric_cols] + sessions)
    for p in points:
        row = [p.figure(k) for k in CSV_FIELDS] + [getattr(p, m)[s] for m, s in metric_cols]
        writer.writerow(row + [session_cell(p, column) for column in sessions])
    return out.getvalue()


def session_cell(point: PointSummary, column: str) -> object:
    block, name, stat = {**SESSION_COLUMNS, **CLIENT_COLUMNS, **STEADY_COLUMNS}[column]
    holder = getattr(point, block) if block else point
    value = getattr(holder, name) if holder is not None else None
    return (value or {}).get(stat) if stat else value


def turns_csv(points: list[PointSummary]) -> str | None:
    """Every multi-turn point's per-turn figures as CSV, one row per point and turn index (None: the
    run has no multi-turn point)."""
    rows = [(p.key, t) for p in points for t in p.turns or []]
    if not rows:
        return None
    stats = [k for k in rows[0][1].ttft_ms if k != "mean"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(TURN_FIELDS + [f"{m}_{s}" for m in ("ttft_ms", "e2e_ms") for s in stats])
    for key, turn in rows:
        figures = [turn.ttft_ms[s] for s in stats] + [turn.e2e_ms[s] for s in stats]
        writer.writerow([key] + [getattr(turn, k) for k in TURN_FIELDS[1:]] + figures)
    return out.getvalue()


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so a reader or a crash never sees
    half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename, so that a power cut cannot leave it empty
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def recorded_slo(settings: RunSettings) -> dict[str, float]:
    """The SLOs a run was measured against (seconds), from its settings as summary.json keeps them."""
    return parse_slo(settings.slo)


def recorded_server_args(point: PointSummary) -> dict | None:
    """A point's server arguments as they may be shown: the API key's value replaced, also in a run
    folder written before the bench redacted them."""
    return redact_args(point.server_args)


def machine_info() -> Machine:
    """The machine a run was measured on, kept in its settings."""
    return Machine(
        host=platform.node(),
        cpu=platform.processor() or platform.machine(),
        cores=os.cpu_count(),
        python=platform.python_version(),
        system=platform.platform(),
    )
