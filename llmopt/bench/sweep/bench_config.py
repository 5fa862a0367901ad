"""What a bench run measures: the target (an endpoint or local `llmopt serve` configs), the workload and
the load points, nested as the recipe's tables (each setting declared once, in settings.py). A recipe
fills a `BenchConfig`, command-line flags override it (`with_overrides`), and `validate` says what cannot
run before anything starts."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.wire import APIS, SESSION_APIS
from llmopt.bench.redact import redact_args
from llmopt.bench.rundir import check_server_name
from llmopt.bench.servers.server_spec import ServerSpec
from llmopt.bench.settings import (
    TABLES,
    LoadSettings,
    TargetSettings,
    WorkloadSettings,
    setting_fields,
    setting_name,
)
from llmopt.bench.slo import parse_slo
from llmopt.bench.sweep.goodput_search import GoodputSearch
from llmopt.bench.sweep.habit import Habit
from llmopt.bench.workload import SESSION_WORKLOADS, WORKLOADS
from llmopt.bench.workload.trace import read_trace, send_times

# The settings in the order a run folder's summary.json has always listed them (runs written before the
# recipe's tables nested them keep their bytes); a setting added since follows them, in its table's order.
RECORDED_ORDER = (
    *("endpoint", "model", "api", "servers", "workload", "prompt_lens", "output_lens", "prefix_len"),
    *("num_prefixes", "dataset", "concurrencies", "request_rates", "arrival", "max_concurrency"),
    *("num_requests", "max_seconds", "warmup", "slo", "percentiles", "max_error_rate", "ignore_eos"),
    *("tokenizer", "seed", "request_timeout", "connection_reuse", "sessions", "turns", "system_len"),
    *("agent_tools", "think_time", "burstiness", "ramp_up", "prompt_len_spread", "streams"),
    *("reset_prefix_cache", "goodput_search", "search_percentile", "search_tolerance", "num_runs"),
    *("rounds", "workers", "trace", "trace_block_size", "replay_speeds", "recipe", "metrics_interval"),
    *("habits", "stop_on_saturation"),
)
# Not recorded: an API key, neither ours nor a local server's; and the cache, which is where checkpoints
# are kept, not what is measured (a resumed run may move it).
NOT_RECORDED = ("api_key", "quantized_cache")
# {setting name: (its table, its field)}; the names the tables' fields do not hold are BenchConfig's own.
BY_NAME = {setting_name(f): (table, f.name) for table, f in setting_fields()}
OWN = ("servers", "habits", "recipe")


@dataclass
class BenchConfig:
    """Every bench setting: the recipe's tables (each field's default is the setting's: settings.py), the
    local server configs ([[serve]]), the client habits ([[habit]]) and the recipe's path."""

    target: TargetSettings = field(default_factory=TargetSettings)
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    load: LoadSettings = field(default_factory=LoadSettings)
    servers: list[ServerSpec] = field(default_factory=list)
    # A recipe's [[habit]] entries: each baseline point is run once more per habit, with its one change.
    habits: list[Habit] = field(default_factory=list)
    recipe: str | None = None

    @classmethod
    def from_settings(cls, **settings: object) -> BenchConfig:
        """The defaults with these settings, by name (`num_requests=8`, `servers=[...]`)."""
        return cls().replaced(settings)

    def settings(self) -> dict[str, object]:
        """{setting name: value} of every table's settings (the names a run records them by)."""
        return {name: getattr(getattr(self, table), f) for name, (table, f) in BY_NAME.items()}

    def replaced(self, settings: dict[str, object]) -> BenchConfig:
        """These settings with some replaced, by name; a name that is no setting is a ValueError."""
        unknown = set(settings) - set(BY_NAME) - set(OWN)
        if unknown:
            raise ValueError(f"not a bench setting: {', '.join(sorted(unknown))}")
        tables: dict[str, dict[str, object]] = {table: {} for table in TABLES}
        for name, value in settings.items():
            if name in BY_NAME:
                table, f = BY_NAME[name]
                tables[table][f] = value
        own = {name: value for name, value in settings.items() if name in OWN}
        # Every table copied, changed or not: validate() fills in defaults of its own config's tables only.
        copied = {table: dataclasses.replace(getattr(self, table), **v) for table, v in tables.items()}
        return dataclasses.replace(self, **copied, **own)

    def validate(self) -> None:
        """Raise BenchError for a setting that cannot run; with no load point given, run concurrency 1."""
        if not self.target.endpoint and not self.servers:
            raise BenchError(
                "give --endpoint URL (any OpenAI-compatible server) or a --recipe with [[serve]] configs"
            )
        if self.target.api not in APIS:
            raise BenchError(f"--api must be one of {', '.join(APIS)}")
        if self.load.arrival not in ("poisson", "constant"):
            raise BenchError("--arrival must be 'poisson' or 'constant'")
        if self.workload.kind not in WORKLOADS:
            raise BenchError(f"--workload must be one of {', '.join(WORKLOADS)}")
        if self.workload.kind in ("file", "conversations") and not self.workload.dataset:
            raise BenchError(
                f"the '{self.workload.kind}' workload needs --dataset FILE (JSONL or ShareGPT JSON)"
            )
        self._validate_replay()
        self._validate_sessions()
        self._validate_traffic()
        if any(c < 1 for c in self.load.concurrencies) or any(r <= 0 for r in self.load.request_rates):
            raise BenchError("concurrency must be >= 1 and request rates > 0")
        if (
            any(n < 1 for n in self.workload.prompt_lens + self.workload.output_lens)
            or self.load.num_requests < 1
        ):
            raise BenchError("prompt and output lengths and --num-requests must be >= 1")
        if self.load.max_error_rate is not None and not 0 <= self.load.max_error_rate <= 1:
            raise BenchError("--max-error-rate is a fraction between 0 and 1")
        if not self.load.request_timeout > 0:
            raise BenchError("--request-timeout must be a positive number of seconds")
        if self.load.num_runs < 1:
            raise BenchError("--num-runs must be >= 1")
        if self.load.rounds < 1:
            raise BenchError("rounds must be >= 1")
        if self.load.rounds > 1 and self.load.goodput_search:
            raise BenchError("rounds and --goodput-search do not mix: a search's probes follow each other")
        if self.workload.agent_tools not in ("api", "text"):
            raise BenchError("the agent workload's tools are 'api' (sent as `tools`) or 'text' (in messages)")
        if self.load.workers < 1:
            raise BenchError("--workers must be >= 1")
        try:
            parse_slo(self.load.slo)
            for server in self.servers:
                check_server_name(server.name)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
        for server in self.servers:
            server.check_engine()
        names = [server.name for server in self.servers]
        if len(set(names)) < len(names):
            raise BenchError(f"server names must differ (each names its points and log): {', '.join(names)}")
        if not self.load.metrics_interval >= 0:
            raise BenchError("--metrics-interval is a number of seconds, 0 (off) or more")
        self._validate_search()
        self._validate_habits()

    def _validate_sessions(self) -> None:
        """Multi-turn workloads count sessions, the others requests; with no load point, run one of either."""
        if self.workload.kind not in SESSION_WORKLOADS:
            if self.load.sessions:
                raise BenchError(f"--sessions is for the {', '.join(SESSION_WORKLOADS)} workloads")
            if not self.load.concurrencies and not self.load.request_rates and not self.load.replay_speeds:
                self.load.concurrencies = [1]
            return
        if self.load.concurrencies:
            raise BenchError(
                f"the {self.workload.kind} workload counts sessions: give --sessions N (sessions at once) or "
                "--request-rate R (sessions started per second), not --concurrency"
            )
        if self.target.api not in SESSION_APIS:
            apis = " or ".join(SESSION_APIS)
            raise BenchError(f"the {self.workload.kind} workload sends conversations: it needs --api {apis}")
        if not self.load.sessions and not self.load.request_rates:
            self.load.sessions = [1]
        if any(s < 1 for s in self.load.sessions) or self.workload.turns < 1 or self.workload.system_len < 0:
            raise BenchError("--sessions and --turns must be >= 1 and --system-len >= 0")
        if not self.load.think_time >= 0:
            raise BenchError("--think-time is a number of seconds, 0 or more")

    def _validate_replay(self) -> None:
        """The replay workload sends at its trace's times (at speed 1 unless given); a bad trace line is
        an error now, before any server starts."""
        if self.workload.kind != "replay":
            if self.load.replay_speeds or self.workload.trace:
                raise BenchError("--trace and --replay-speed are for the replay workload (--workload replay)")
            return
        if not self.workload.trace:
            raise BenchError("the replay workload needs --trace FILE (JSONL in the Mooncake trace format)")
        if self.load.concurrencies or self.load.request_rates:
            raise BenchError(
                "the replay workload sends at its trace's times: give --replay-speed, not --concurrency or "
                "--request-rate"
            )
        self.load.replay_speeds = self.load.replay_speeds or [1.0]
        if not all(s > 0 for s in self.load.replay_speeds) or self.workload.trace_block_size < 1:
            raise BenchError("--replay-speed must be positive and --trace-block-size >= 1")
        try:
            read_trace(Path(self.workload.trace))
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    def _validate_traffic(self) -> None:
        if not self.load.burstiness > 0:
            raise BenchError("--burstiness must be positive (1 is Poisson, below 1 burstier)")
        if self.load.burstiness != 1.0 and self.load.arrival != "poisson":
            raise BenchError("--burstiness shapes Poisson arrivals: it needs --arrival poisson")
        if not self.load.ramp_up >= 0:
            raise BenchError("--ramp-up is a number of seconds, 0 or more")
        if not 0 <= self.workload.prompt_len_spread < 1:
            raise BenchError("--prompt-len-spread is a fraction, at least 0 and below 1")
        if not self.load.streams or not all(isinstance(s, bool) for s in self.load.streams):
            raise BenchError("stream is true, false, or a list of them")

    def _validate_search(self) -> None:
        if self.load.goodput_search is None:
            return
        try:
            slo = parse_slo(self.load.goodput_search)
        except ValueError as exc:
            raise BenchError(f"--goodput-search: {exc}") from None
        if not slo:
            raise BenchError("--goodput-search needs SLOs, e.g. ttft=500ms,tpot=50ms")
        if len(self.load_points()) != 1:
            raise BenchError(
                "--goodput-search starts from one load point: give one --concurrency, --sessions or "
                "--request-rate (the first probe) and one stream setting"
            )
        if not 0 < self.load.search_percentile <= 100 or not self.load.search_tolerance > 0:
            raise BenchError("--search-percentile is in (0, 100] and --search-tolerance positive")
        if self.load.search_percentile not in self.load.percentiles:  # the search reads it from the summaries
            self.load.percentiles = tuple(sorted({*self.load.percentiles, self.load.search_percentile}))

    def _validate_habits(self) -> None:
        names = [habit.name for habit in self.habits]
        if len(set(names)) < len(names):
            raise BenchError(f"habit names must differ (each names its points): {', '.join(names)}")
        if self.habits and self.load.goodput_search:
            raise BenchError("habits and --goodput-search do not mix: measure habits at given load points")
        for habit in self.habits:
            try:
                habit.check()
                self.habit_config(habit)._validate_traffic()
            except (ValueError, BenchError) as exc:
                raise BenchError(f"habit {habit.name!r}: {exc}") from None
            if not any(habit.applies_to(p) for p in self.load_points()):
                raise BenchError(
                    f"habit {habit.name!r} shapes arrivals: it needs request-rate or session-rate points"
                )

    def habit_config(self, habit: Habit) -> BenchConfig:
        """The settings a habit's points run with: these, with the habit's changes and no habits."""
        return self.replaced({"habits": [], **habit.fields()})

    def search(self) -> GoodputSearch:
        """The goodput search the settings ask for (validate first)."""
        [first] = self.load_points()
        axis = load_axis(first)
        return GoodputSearch(
            parse_slo(self.load.goodput_search),
            getattr(first, axis),
            axis in ("concurrency", "sessions"),
            self.load.search_percentile,
            self.load.search_tolerance,
        )

    def search_point(self, load: float) -> LoadPoint:
        """The search's probe at `load`: the given load point with its load replaced."""
        [first] = self.load_points()
        axis = load_axis(first)
        return dataclasses.replace(
            first, **{axis: int(load) if axis in ("concurrency", "sessions") else load}
        )

    def recorded(self) -> dict:
        """The settings as a run folder keeps them (summary.json's `settings.config`): one flat list by
        setting name in RECORDED_ORDER, JSON values, without any API key, neither ours nor a local
        server's."""
        values = {
            **self.settings(),
            "servers": [recorded_server(server) for server in self.servers],
            "habits": [dataclasses.asdict(habit) for habit in self.habits],
            "recipe": self.recipe,
        }
        order = [*RECORDED_ORDER, *(name for name in values if name not in RECORDED_ORDER)]
        return json.loads(json.dumps({name: values[name] for name in order if name not in NOT_RECORDED}))

    def load_points(self) -> list[LoadPoint]:
        common = {
            "num_requests": self.load.num_requests,
            "max_seconds": self.load.max_seconds,
            "warmup": self.load.warmup,
            "max_error_rate": self.load.max_error_rate,
            "seed": self.workload.seed,
            "think_time": self.load.think_time,
            "workers": self.load.workers,
            "stop_on_saturation": self.load.stop_on_saturation,
        }
        open_loop = {
            "arrival": self.load.arrival,
            "max_concurrency": self.load.max_concurrency,
            "burstiness": self.load.burstiness,
            "ramp_up_s": self.load.ramp_up,
        }
        # A multi-turn workload's rate starts sessions; any other's sends requests.
        rate = "session_rate" if self.workload.kind in SESSION_WORKLOADS else "request_rate"
        points = [LoadPoint(concurrency=c, **common) for c in self.load.concurrencies]
        points += [LoadPoint(sessions=s, **common) for s in self.load.sessions]
        points += [LoadPoint(**{rate: r}, **open_loop, **common) for r in self.load.request_rates]
        if self.load.replay_speeds:
            schedule = send_times(read_trace(Path(self.workload.trace)))
            replay = {**common, "num_requests": min(self.load.num_requests, len(schedule))}
            points += [
                LoadPoint(
                    replay_speed=s, schedule=schedule, max_concurrency=self.load.max_concurrency, **replay
                )
                for s in self.load.replay_speeds
            ]
        return [dataclasses.replace(p, stream=stream) for stream in self.load.streams for p in points]


def load_axis(point: LoadPoint) -> str:
    """Which load a point sets: concurrency, request_rate, sessions, session_rate or replay_speed."""
    return next(
        a
        for a in ("concurrency", "request_rate", "sessions", "session_rate", "replay_speed")
        if getattr(point, a) is not None
    )


def recorded_server(server: ServerSpec) -> dict:
    """A [[serve]] config as a run folder keeps it: its args without the API key."""
    recorded = {**dataclasses.asdict(server), "args": redact_args(server.args)}
    if recorded["quantize"] is None:  # as runs written before quantization recorded it (resume)
        del recorded["quantize"]
    if recorded["engine"] == "llmopt":  # likewise: runs before other engines were all llmopt's
        del recorded["engine"]
    return recorded


def with_overrides(config: BenchConfig, overrides: dict[str, object]) -> BenchConfig:
    """`config` with every override that is not None in place of its value ({setting name: value}).

    None means "not given", so a flag's value counts even when it equals the default (`--api chat`
    over a recipe's "completions"). An endpoint replaces the config's local servers: the command line
    then points the recipe at another server instead of starting its own."""
    given = {key: value for key, value in overrides.items() if value is not None}
    if given.get("endpoint"):
        given["servers"] = []
    return config.replaced(given)
