"""A run folder's records, typed: what requests.jsonl holds for each request (RequestRecord), what
summary.json holds for each point (PointSummary) and for the run (RunSettings). Each type's to_json and
from_json are the one place that knows the keys; rundir.py reads and writes the files with them, and the
report, `llmopt cost --run` and the CLI read attributes.

A key a summary of today does not hold reads as its field's default, so a run folder written before a
field existed still loads; the blocks a point has only sometimes (OPTIONAL) are written only where they
are set, in the place today's bench writes them, so a run's summary.json is rewritten byte for byte."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any

# A latency's statistics in milliseconds (distribution.py): {"mean", "median", "p50", ..., "p99"}; a
# statistic with no value (no request) is None.
Distribution = dict[str, float | None]


def known_fields(cls: type, data: dict) -> dict:
    """The items of `data` that are fields of the dataclass `cls`."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def plain(value: Any) -> Any:
    """`value` as JSON holds it: a block as its to_json(), lists and dicts of blocks likewise."""
    if dataclasses.is_dataclass(value):
        return value.to_json()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class Block:
    """A summary's block of plain fields: every field written, in order; a key it lacks reads as the
    field's default (a run written before it). A key it does not know is dropped, or, in a block with an
    `other` field, kept there and written back after the others."""

    @classmethod
    def from_json(cls, data: dict):
        known = known_fields(cls, data)
        if "other" not in known and any(f.name == "other" for f in dataclasses.fields(cls)):
            known["other"] = {k: v for k, v in data.items() if k not in known}
        return cls(**known)

    def to_json(self) -> dict:
        out = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "other"}
        return {**out, **getattr(self, "other", {})}


@dataclass
class RequestRecord:
    """What one request measured (times in seconds; `start` is relative to the load point's start), as
    the client fills it in and requests.jsonl keeps it."""

    index: int
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    # Of cached_tokens, those the server loaded from a disk tier (llmopt serve's usage field
    # prompt_tokens_details.disk_cached_tokens); None where the server does not say.
    disk_cached_tokens: int | None = None
    cache_write_tokens: int = 0  # prompt tokens the server says it wrote to its cache (Anthropic's usage)
    # A later turn of a Responses API session: True when it named the previous answer
    # (previous_response_id), False when it replayed the whole history (the server refused chaining).
    chained: bool | None = None
    # Where the token counts are from (token_count.py): "usage" (the server's answer), "tokenize" (the
    # server's /tokenize, for counts the answer left out) or "local" (the local tokenizer, for any other)
    tokens_from: str = "usage"
    status: int | None = None
    error: str | None = None
    success: bool = False
    session: int | None = None  # multi-turn workloads: the session's number in its point
    turn: int | None = None  # ... and the turn's index in its session (0 first)
    # Sends that failed before any response byte and were made again on a fresh connection (0 or 1).
    reconnects: int = 0
    finish_reason: str | None = None  # the server's, e.g. "stop" or "length" (cut by max_tokens)
    # Requests with a response_format: "valid", "truncated" (cut by max_tokens before the JSON ended) or
    # "invalid" (not JSON, or not of the schema); None for free text
    structured: str | None = None
    # The answer's text: the next turn of a session sends it back. Not written to requests.jsonl.
    text: str | None = None
    # The answer's id: the next turn of a chained (Responses API) session names it. Not written either.
    response_id: str | None = None
    # Read back from requests.jsonl: the key of the point it belongs to, and its run among the point's
    # runs (where the point had several); written as tags (to_json's `extra`), absent while it runs.
    point: str | None = None
    run: int | None = None

    def to_json(self, **extra) -> str:
        """Its requests.jsonl line, `extra` (the point's key, the run) added at the end."""
        values = asdict(self)
        del values["text"], values["response_id"]
        tags = {name: values.pop(name) for name in ("point", "run")}
        return json.dumps({**values, **{k: v for k, v in tags.items() if v is not None}, **extra})

    @classmethod
    def from_json(cls, line: dict) -> RequestRecord:
        """A requests.jsonl line read back (a key of another version of the bench is left out)."""
        return cls(**known_fields(cls, line))


@dataclass
class SteadyStateBlock(Block):
    """What a point's latencies and throughputs were computed over (measure/steady_state.py)."""

    rule: str | None = None
    applied: bool | None = None  # whether any run was cut
    kept: int | None = None  # successful requests whose latencies count
    of: int | None = None  # successful requests in all
    throughput_requests: float | None = None  # requests' shares of the output counted
    throughput_span_s: float | None = None


@dataclass
class ClientBlock(Block):
    """The client's self-check over a point (load/self_check.py)."""

    workers: int = 1
    loop_lag_ms: Distribution = field(default_factory=dict)  # its "max" too
    cpu: float | None = None  # the busiest process's event loop's share of a core
    cpu_per_process: list[float] = field(default_factory=list)
    process_cpu: float | None = None
    limited: bool = False  # whether the client, not the server, was the limit
    limited_by: list[str] = field(default_factory=list)


@dataclass
class Conversations(Block):
    """A multi-turn point's sessions (measure/session_metrics.py)."""

    started: int = 0
    completed: int = 0
    failed: int = 0
    turns_per_s: float = 0.0
    conversation_ms: Distribution = field(default_factory=dict)


@dataclass
class PrefixSourceFigures(Block):
    """The turns whose prompt came mostly from one place (RAM, disk, computed) and their TTFT."""

    turns: int = 0
    ttft_ms: Distribution = field(default_factory=dict)


@dataclass
class TurnFigures(Block):
    """A multi-turn point's figures for one turn index (measure/session_metrics.py)."""

    turn: int = 0
    requests: int = 0
    successful: int = 0
    prompt_tokens_mean: float | None = None
    cached_fraction: float | None = None
    disk_cached_fraction: float | None = None
    ttft_ms: Distribution = field(default_factory=dict)
    ttft_by_prefix: dict[str, PrefixSourceFigures] | None = None  # {"ram" | "disk" | "computed": ...}
    e2e_ms: Distribution = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict) -> TurnFigures:
        turn = cls(**known_fields(cls, data))
        if turn.ttft_by_prefix is not None:
            split = turn.ttft_by_prefix.items()
            turn.ttft_by_prefix = {k: PrefixSourceFigures.from_json(v) for k, v in split}
        return turn


@dataclass
class RepeatedMetric(Block):
    """One headline metric over a repeated point's runs or rounds (sweep/repeats.py)."""

    values: list[float] = field(default_factory=list)
    mean: float | None = None
    ci95: list[float] = field(default_factory=list)  # [low, high]
    spread: float | None = None


@dataclass
class Repeats:
    """A repeated point's headline metrics, each over its runs (or rounds: `over`)."""

    runs: int = 0
    metrics: dict[str, RepeatedMetric] = field(default_factory=dict)  # {"ttft_ms.median": ..., ...}
    over: str | None = None  # "rounds" where it is over rounds; not written otherwise

    @classmethod
    def from_json(cls, data: dict) -> Repeats:
        metrics = {name: RepeatedMetric.from_json(m) for name, m in (data.get("metrics") or {}).items()}
        return cls(data.get("runs", 0), metrics, data.get("over"))

    def to_json(self) -> dict:
        out = {"runs": self.runs, "metrics": plain(self.metrics)}
        return out if self.over is None else {**out, "over": self.over}


@dataclass
class ServerFigures(Block):
    """What the server said of itself during a point (observe/server_metrics.py), under today's names
    (rundir.py renames an earlier run's)."""

    samples: int = 0
    engine: str | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_mean: float | None = None
    kv_cache_usage_max: float | None = None
    prefix_cache_hit_rate: float | None = None
    preemptions: float | None = None
    spec_acceptance: float | None = None
    # Figures under names this version does not know (another version's), kept as they were.
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchProbe(Block):
    """A goodput search's probe: its number, load, whether it met the SLOs and whether it is the answer
    (sweep/goodput_search.py)."""

    probe: int = 0
    load: float = 0.0
    meets_slo: bool = False
    answer: bool = False


# The blocks a point summary holds only sometimes, written only where set: SLO figures with an SLO,
# sessions with a multi-turn workload, repeats with several runs, a habit's, a search's.
OPTIONAL = frozenset(
    {
        "steady_state",
        "chained_turns",
        "replayed_turns",
        "slo",
        "goodput",
        "slo_attainment",
        "spec",
        "conversations",
        "turns",
        "tools",
        "repeats",
        "rounds",
        "habit",
        "habit_changes",
        "baseline_key",
        "search",
    }
)
# Optional fields the bench writes, even as None, wherever another one is set: a multi-turn point's
# tools, a local server's speculation counters.
WRITTEN_WITH = {"tools": "conversations", "spec": "server_args"}
POINT_BLOCKS: dict[str, Any] = {
    "steady_state": SteadyStateBlock,
    "conversations": Conversations,
    "repeats": Repeats,
    "server_metrics": ServerFigures,
    "client": ClientBlock,
    "search": SearchProbe,
}


@dataclass
class PointSummary:
    """One load point's figures, as summary.json keeps them (sweep/point_summary.py writes them): its
    requests' counts, throughputs and latency distributions (measure/request_metrics.py), then what
    it was (server, lengths, load), then what the server, the client and the machine said of it. Field
    order is the file's key order."""

    requests: int = 0
    successful: int = 0
    failed: int = 0
    reconnects: int = 0
    structured_valid: int | None = None
    structured_truncated: int | None = None
    structured_invalid: int | None = None
    duration_s: float = 0.0
    request_throughput: float = 0.0
    output_throughput: float = 0.0
    total_token_throughput: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    tokens_from: list[str] = field(default_factory=list)
    token_source: str | None = None
    ttft_ms: Distribution = field(default_factory=dict)
    tpot_ms: Distribution = field(default_factory=dict)
    tokens_per_chunk: float | None = None
    itl_ms: Distribution = field(default_factory=dict)
    e2e_ms: Distribution = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    steady_state: SteadyStateBlock | None = None
    chained_turns: int | None = None
    replayed_turns: int | None = None
    slo: dict[str, float] | None = None  # {"ttft": ms, ...}
    goodput: float | None = None
    slo_attainment: float | None = None
    spec: dict[str, float] | None = None  # the server's speculation counters' growth
    conversations: Conversations | None = None
    turns: list[TurnFigures] | None = None
    tools: str | None = None
    repeats: Repeats | None = None
    rounds: int | None = None
    key: str = ""
    server: str = ""
    model: str = ""
    endpoint: str = ""
    prompt_len: int = 0
    output_len: int = 0
    load: str = ""
    concurrency: int | None = None
    request_rate: float | None = None
    sessions: int | None = None
    session_rate: float | None = None
    replay_speed: float | None = None
    stream: bool = True  # a run written before the bench could ask for whole answers streamed
    server_args: dict[str, Any] | None = None  # a local server's arguments, its API key redacted
    stopped_early: str | None = None
    prefix_cache_reset: bool | None = None
    warnings: list[str] = field(default_factory=list)
    server_metrics: ServerFigures | None = None
    client: ClientBlock | None = None
    client_limited: bool | None = None
    saturated: bool | None = None
    saturation_reason: str | None = None
    saturation: dict[str, Any] | None = None  # the signals judged (load/saturation.py's Signals)
    server_cpu_s: float | None = None
    server_cores: float | None = None
    cpu_s_per_1k_tokens: float | None = None
    cpu_source: str | None = None
    energy_j: float | None = None
    joules_per_token: float | None = None
    energy_source: str | None = None
    energy_domains: list[str] | None = None
    decode_weight_bytes: float | None = None
    decode_read_gbs: float | None = None
    machine_read_gbs: float | None = None
    decode_read_share: float | None = None
    habit: str | None = None
    habit_changes: dict[str, Any] | None = None  # {setting: [before, after]}
    baseline_key: str | None = None
    search: SearchProbe | None = None
    # Keys this version of the bench does not know (a later one's), kept as they were.
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict) -> PointSummary:
        known = known_fields(cls, data)
        known.pop("other", None)
        for name, block in POINT_BLOCKS.items():
            if known.get(name) is not None:
                known[name] = block.from_json(known[name])
        if known.get("turns") is not None:
            known["turns"] = [TurnFigures.from_json(t) for t in known["turns"]]
        return cls(**known, other={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "other" or (value is None and f.name in OPTIONAL and not self.written_with(f.name)):
                continue
            out[f.name] = plain(value)
        return {**out, **self.other}

    def written_with(self, name: str) -> bool:
        partner = WRITTEN_WITH.get(name)
        return partner is not None and getattr(self, partner) is not None

    def figure(self, name: str, stat: str | None = None) -> Any:
        """A field by its name (a table's column, a verdict's metric), or one figure of it: a latency's
        statistic, figure("ttft_ms", "p99"), or a block's field, figure("steady_state", "kept"); None
        where the point has none."""
        value = getattr(self, name)
        if stat is None or value is None:
            return value
        return value.get(stat) if isinstance(value, dict) else getattr(value, stat)


@dataclass
class Machine(Block):
    """The machine a run was measured on (rundir.py's machine_info)."""

    host: str | None = None
    cpu: str | None = None
    cores: int | None = None
    python: str | None = None
    system: str | None = None


@dataclass
class SkippedPoint(Block):
    """A point --stop-on-saturation did not run, and why."""

    key: str = ""
    reason: str = ""


@dataclass
class GoodputAnswer(Block):
    """One prompt and output length's goodput search: its SLOs, the answer and its probes' keys."""

    server: str = ""
    prompt_len: int = 0
    output_len: int = 0
    slo: str | None = None  # as given, e.g. "ttft=500ms"
    percentile: float = 90.0
    answer: float | None = None  # the highest load meeting the SLOs; None: no probe met them
    answer_key: str | None = None
    probes: list[str] = field(default_factory=list)


@dataclass
class QuantizationRecord:
    """A quantized config's record (servers/quantized_serve.py, from its quant_report.json): the figures
    the report reads, typed; the record is kept whole, so a run is written back as it was read (a field
    list of its own would reorder a baseline's keys and add nulls)."""

    record: dict[str, Any]

    def to_json(self) -> dict:
        return self.record

    @property
    def method(self) -> str | None:
        return self.record.get("method")

    @property
    def quantized(self) -> bool:
        return self.method not in (None, "none")

    @property
    def size_after_mb(self) -> float | None:
        return self.record.get("size_after_mb")

    @property
    def perplexity(self) -> float | None:
        return self.record.get("perplexity")

    @property
    def perplexity_before(self) -> float | None:
        return self.record.get("perplexity_before")

    @property
    def kld_mean(self) -> float | None:
        stats = self.record.get("kl_divergence")
        return stats.get("mean") if isinstance(stats, dict) else None

    @property
    def checkpoint(self) -> str | None:
        return self.record.get("checkpoint")

    @property
    def cached(self) -> bool | None:
        return self.record.get("cached")


@dataclass
class RunSettings:
    """summary.json's "settings": the run's config as recorded (BenchConfig.recorded(): flat, one key
    per setting), when it started and where, and what its sweep decided as it ran."""

    config: dict[str, Any] = field(default_factory=dict)
    started: str | None = None
    machine: Machine | None = None
    # {server: its quantization record} (servers/quantized_serve.py), where the run quantized a config
    quantization: dict[str, QuantizationRecord] | None = None
    search: list[GoodputAnswer] | None = None  # a goodput search's answers
    skipped: list[SkippedPoint] | None = None  # --stop-on-saturation's skipped points
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict) -> RunSettings:
        known = known_fields(cls, data)
        known.pop("other", None)
        if known.get("machine") is not None:
            known["machine"] = Machine.from_json(known["machine"])
        if known.get("quantization") is not None:
            known["quantization"] = {s: QuantizationRecord(r) for s, r in known["quantization"].items()}
        if known.get("search") is not None:
            known["search"] = [GoodputAnswer.from_json(s) for s in known["search"]]
        if known.get("skipped") is not None:
            known["skipped"] = [SkippedPoint.from_json(s) for s in known["skipped"]]
        return cls(**known, other={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict:
        out = {"config": self.config}
        for name in ("started", "machine", "quantization", "search", "skipped"):
            if (value := getattr(self, name)) is not None:
                out[name] = plain(value)
        return {**out, **self.other}

    @property
    def slo(self) -> str | None:
        """The SLOs as given (slo.py parses them), e.g. "ttft=500ms,tpot=50ms"; None: none set."""
        return self.config.get("slo")

    @property
    def percentiles(self) -> tuple[float, ...]:
        return tuple(self.config.get("percentiles") or ())

    @property
    def recipe(self) -> str | None:
        return self.config.get("recipe")

    @property
    def workload(self) -> str | None:
        return self.config.get("workload")

    @property
    def api(self) -> str | None:
        return self.config.get("api")


@dataclass
class RunSummary:
    """summary.json: the run's settings and its finished points, in the order they ran."""

    settings: RunSettings = field(default_factory=RunSettings)
    points: list[PointSummary] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict) -> RunSummary:
        points = [PointSummary.from_json(p) for p in data.get("points", [])]
        return cls(RunSettings.from_json(data.get("settings", {})), points)

    def to_json(self) -> dict:
        return {"settings": self.settings.to_json(), "points": [p.to_json() for p in self.points]}
