"""What a bench run measures: the target (an endpoint or local `llmopt serve` configs), the workload and
the load points. A recipe fills a `BenchConfig`, command-line flags override it (`with_overrides`), and
`validate` says what cannot run before anything starts."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.distribution import DEFAULT_PERCENTILES
from llmopt.bench.load.load_point import LoadPoint
from llmopt.bench.load.wire import APIS, SESSION_APIS
from llmopt.bench.redact import redact_args
from llmopt.bench.rundir import check_server_name
from llmopt.bench.servers.server_spec import ServerSpec
from llmopt.bench.slo import parse_slo
from llmopt.bench.sweep.goodput_search import GoodputSearch
from llmopt.bench.sweep.habit import Habit
from llmopt.bench.workload import SESSION_WORKLOADS, WORKLOADS
from llmopt.bench.workload.trace import MOONCAKE_BLOCK_SIZE, read_trace, send_times


@dataclass
class BenchConfig:
    """Every bench setting with its default; a recipe or a flag that leaves one out gets this value."""

    endpoint: str | None = None
    model: str | None = None
    api_key: str | None = None
    api: str = "chat"
    servers: list[ServerSpec] = field(default_factory=list)
    workload: str = "random"
    prompt_lens: list[int] = field(default_factory=lambda: [128])
    output_lens: list[int] = field(default_factory=lambda: [128])
    prefix_len: int = 0
    num_prefixes: int = 1
    dataset: str | None = None
    concurrencies: list[int] = field(default_factory=list)
    request_rates: list[float] = field(default_factory=list)
    arrival: str = "poisson"
    max_concurrency: int | None = None
    num_requests: int = 64
    max_seconds: float | None = None
    warmup: int = 2
    slo: str | None = None
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    max_error_rate: float | None = None
    ignore_eos: bool = True
    tokenizer: str | None = None
    seed: int = 0
    request_timeout: float = 600.0  # a request fails once the server sends nothing for this many seconds
    # False: a new connection per request, for servers that drop kept-alive connections without saying so
    # (xllamacpp's llama.cpp server after a stream); the bench never re-sends a request on a dead one.
    connection_reuse: bool = True
    # Multi-turn workloads (multi-turn, agent, conversations): sessions at once (a sweep axis; rates are
    # then sessions started per second), turns per session, the shared system prompt's length, and the
    # pause between an answer and the next turn. Their turn length is the prompt-length axis.
    sessions: list[int] = field(default_factory=list)
    turns: int = 4
    system_len: int = 256
    # The agent workload's tools: "api" sends them as `tools` (text once a server refuses them); "text"
    # writes them into the messages for every server alike, so that no engine's tool support counts.
    agent_tools: str = "api"
    think_time: float = 0.0
    burstiness: float = 1.0  # gamma shape of Poisson arrivals (vllm bench serve's): 1 Poisson, < 1 burstier
    ramp_up: float = 0.0  # seconds over which a rate point's rate grows linearly from 0
    prompt_len_spread: float = 0.0  # prompt (or turn) lengths drawn uniformly from length * (1 +- this)
    streams: list[bool] = field(default_factory=lambda: [True])  # a sweep axis: [True, False] tries both
    reset_prefix_cache: bool = True  # POST /reset_prefix_cache before each point, where the server has it
    # The highest load meeting these SLOs (search.py), from the one load point given as the first probe.
    goodput_search: str | None = None
    search_percentile: float = 90.0
    search_tolerance: float = 0.1
    num_runs: int = 1  # each point this many times: summaries then carry each headline metric's 95 % CI
    # Server configs take turns this many times (rounds.py): round 1 of every config, then round 2 ...
    rounds: int = 1
    workers: int = 1  # client processes that share each point's load (workers.py), for what one cannot drive
    # The replay workload: a trace file (trace.py), its block size, and the speeds to replay it at (a
    # sweep axis, one point each: 2.0 sends twice as fast as the trace).
    trace: str | None = None
    trace_block_size: int = MOONCAKE_BLOCK_SIZE
    replay_speeds: list[float] = field(default_factory=list)
    recipe: str | None = None
    # The server's /metrics sampled this often during each point (server_metrics.py); 0: not sampled.
    metrics_interval: float = 0.5
    # A recipe's [[habit]] entries: each baseline point is run once more per habit, with its one change.
    habits: list[Habit] = field(default_factory=list)
    quantized_cache: str | None = None  # quantized checkpoints' folder; default ~/.cache/llmopt/quantized
    # End a point once it saturates and skip the higher loads of its series (stop_on_saturation.py).
    stop_on_saturation: bool = False

    def validate(self) -> None:
        """Raise BenchError for a setting that cannot run; with no load point given, run concurrency 1."""
        if not self.endpoint and not self.servers:
            raise BenchError(
                "give --endpoint URL (any OpenAI-compatible server) or a --recipe with [[serve]] configs"
            )
        if self.api not in APIS:
            raise BenchError(f"--api must be one of {', '.join(APIS)}")
        if self.arrival not in ("poisson", "constant"):
            raise BenchError("--arrival must be 'poisson' or 'constant'")
        if self.workload not in WORKLOADS:
            raise BenchError(f"--workload must be one of {', '.join(WORKLOADS)}")
        if self.workload in ("file", "conversations") and not self.dataset:
            raise BenchError(f"the '{self.workload}' workload needs --dataset FILE (JSONL or ShareGPT JSON)")
        self._validate_replay()
        self._validate_sessions()
        self._validate_traffic()
        if any(c < 1 for c in self.concurrencies) or any(r <= 0 for r in self.request_rates):
            raise BenchError("concurrency must be >= 1 and request rates > 0")
        if any(n < 1 for n in self.prompt_lens + self.output_lens) or self.num_requests < 1:
            raise BenchError("prompt and output lengths and --num-requests must be >= 1")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate <= 1:
            raise BenchError("--max-error-rate is a fraction between 0 and 1")
        if not self.request_timeout > 0:
            raise BenchError("--request-timeout must be a positive number of seconds")
        if self.num_runs < 1:
            raise BenchError("--num-runs must be >= 1")
        if self.rounds < 1:
            raise BenchError("rounds must be >= 1")
        if self.rounds > 1 and self.goodput_search:
            raise BenchError("rounds and --goodput-search do not mix: a search's probes follow each other")
        if self.agent_tools not in ("api", "text"):
            raise BenchError("the agent workload's tools are 'api' (sent as `tools`) or 'text' (in messages)")
        if self.workers < 1:
            raise BenchError("--workers must be >= 1")
        try:
            parse_slo(self.slo)
            for server in self.servers:
                check_server_name(server.name)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
        for server in self.servers:
            server.check_engine()
        names = [server.name for server in self.servers]
        if len(set(names)) < len(names):
            raise BenchError(f"server names must differ (each names its points and log): {', '.join(names)}")
        if not self.metrics_interval >= 0:
            raise BenchError("--metrics-interval is a number of seconds, 0 (off) or more")
        self._validate_search()
        self._validate_habits()

    def _validate_sessions(self) -> None:
        """Multi-turn workloads count sessions, the others requests; with no load point, run one of either."""
        if self.workload not in SESSION_WORKLOADS:
            if self.sessions:
                raise BenchError(f"--sessions is for the {', '.join(SESSION_WORKLOADS)} workloads")
            if not self.concurrencies and not self.request_rates and not self.replay_speeds:
                self.concurrencies = [1]
            return
        if self.concurrencies:
            raise BenchError(
                f"the {self.workload} workload counts sessions: give --sessions N (sessions at once) or "
                "--request-rate R (sessions started per second), not --concurrency"
            )
        if self.api not in SESSION_APIS:
            apis = " or ".join(SESSION_APIS)
            raise BenchError(f"the {self.workload} workload sends conversations: it needs --api {apis}")
        if not self.sessions and not self.request_rates:
            self.sessions = [1]
        if any(s < 1 for s in self.sessions) or self.turns < 1 or self.system_len < 0:
            raise BenchError("--sessions and --turns must be >= 1 and --system-len >= 0")
        if not self.think_time >= 0:
            raise BenchError("--think-time is a number of seconds, 0 or more")

    def _validate_replay(self) -> None:
        """The replay workload sends at its trace's times (at speed 1 unless given); a bad trace line is
        an error now, before any server starts."""
        if self.workload != "replay":
            if self.replay_speeds or self.trace:
                raise BenchError("--trace and --replay-speed are for the replay workload (--workload replay)")
            return
        if not self.trace:
            raise BenchError("the replay workload needs --trace FILE (JSONL in the Mooncake trace format)")
        if self.concurrencies or self.request_rates:
            raise BenchError(
                "the replay workload sends at its trace's times: give --replay-speed, not --concurrency or "
                "--request-rate"
            )
        self.replay_speeds = self.replay_speeds or [1.0]
        if not all(s > 0 for s in self.replay_speeds) or self.trace_block_size < 1:
            raise BenchError("--replay-speed must be positive and --trace-block-size >= 1")
        try:
            read_trace(Path(self.trace))
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    def _validate_traffic(self) -> None:
        if not self.burstiness > 0:
            raise BenchError("--burstiness must be positive (1 is Poisson, below 1 burstier)")
        if self.burstiness != 1.0 and self.arrival != "poisson":
            raise BenchError("--burstiness shapes Poisson arrivals: it needs --arrival poisson")
        if not self.ramp_up >= 0:
            raise BenchError("--ramp-up is a number of seconds, 0 or more")
        if not 0 <= self.prompt_len_spread < 1:
            raise BenchError("--prompt-len-spread is a fraction, at least 0 and below 1")
        if not self.streams or not all(isinstance(s, bool) for s in self.streams):
            raise BenchError("stream is true, false, or a list of them")

    def _validate_search(self) -> None:
        if self.goodput_search is None:
            return
        try:
            slo = parse_slo(self.goodput_search)
        except ValueError as exc:
            raise BenchError(f"--goodput-search: {exc}") from None
        if not slo:
            raise BenchError("--goodput-search needs SLOs, e.g. ttft=500ms,tpot=50ms")
        if len(self.load_points()) != 1:
            raise BenchError(
                "--goodput-search starts from one load point: give one --concurrency, --sessions or "
                "--request-rate (the first probe) and one stream setting"
            )
        if not 0 < self.search_percentile <= 100 or not self.search_tolerance > 0:
            raise BenchError("--search-percentile is in (0, 100] and --search-tolerance positive")
        if self.search_percentile not in self.percentiles:  # the search reads it from the summaries
            self.percentiles = tuple(sorted({*self.percentiles, self.search_percentile}))

    def _validate_habits(self) -> None:
        names = [habit.name for habit in self.habits]
        if len(set(names)) < len(names):
            raise BenchError(f"habit names must differ (each names its points): {', '.join(names)}")
        if self.habits and self.goodput_search:
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
        return dataclasses.replace(self, habits=[], **habit.fields())

    def search(self) -> GoodputSearch:
        """The goodput search the settings ask for (validate first)."""
        [first] = self.load_points()
        axis = load_axis(first)
        return GoodputSearch(
            parse_slo(self.goodput_search),
            getattr(first, axis),
            axis in ("concurrency", "sessions"),
            self.search_percentile,
            self.search_tolerance,
        )

    def search_point(self, load: float) -> LoadPoint:
        """The search's probe at `load`: the given load point with its load replaced."""
        [first] = self.load_points()
        axis = load_axis(first)
        return dataclasses.replace(
            first, **{axis: int(load) if axis in ("concurrency", "sessions") else load}
        )

    def recorded(self) -> dict:
        """The settings as a run folder keeps them (summary.json): JSON values, without any API key,
        neither ours nor a local server's."""
        # The cache is where checkpoints are kept, not what is measured (a resumed run may move it).
        skipped = ("api_key", "quantized_cache")
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in skipped}
        values["servers"] = [{**server, "args": redact_args(server["args"])} for server in values["servers"]]
        for server in values["servers"]:
            if server["quantize"] is None:  # as runs written before quantization recorded it (resume)
                del server["quantize"]
            if server["engine"] == "llmopt":  # likewise: runs before other engines were all llmopt's
                del server["engine"]
        return json.loads(json.dumps(values))

    def load_points(self) -> list[LoadPoint]:
        common = {
            "num_requests": self.num_requests,
            "max_seconds": self.max_seconds,
            "warmup": self.warmup,
            "max_error_rate": self.max_error_rate,
            "seed": self.seed,
            "think_time": self.think_time,
            "workers": self.workers,
            "stop_on_saturation": self.stop_on_saturation,
        }
        open_loop = {
            "arrival": self.arrival,
            "max_concurrency": self.max_concurrency,
            "burstiness": self.burstiness,
            "ramp_up_s": self.ramp_up,
        }
        # A multi-turn workload's rate starts sessions; any other's sends requests.
        rate = "session_rate" if self.workload in SESSION_WORKLOADS else "request_rate"
        points = [LoadPoint(concurrency=c, **common) for c in self.concurrencies]
        points += [LoadPoint(sessions=s, **common) for s in self.sessions]
        points += [LoadPoint(**{rate: r}, **open_loop, **common) for r in self.request_rates]
        if self.replay_speeds:
            schedule = send_times(read_trace(Path(self.trace)))
            replay = {**common, "num_requests": min(self.num_requests, len(schedule))}
            points += [
                LoadPoint(replay_speed=s, schedule=schedule, max_concurrency=self.max_concurrency, **replay)
                for s in self.replay_speeds
            ]
        return [dataclasses.replace(p, stream=stream) for stream in self.streams for p in points]


def load_axis(point: LoadPoint) -> str:
    """Which load a point sets: concurrency, request_rate, sessions, session_rate or replay_speed."""
    return next(
        a
        for a in ("concurrency", "request_rate", "sessions", "session_rate", "replay_speed")
        if getattr(point, a) is not None
    )


def with_overrides(config: BenchConfig, overrides: dict[str, object]) -> BenchConfig:
    """`config` with every override that is not None in place of its value ({field name: value}).

    None means "not given", so a flag's value counts even when it equals the default (`--api chat`
    over a recipe's "completions"). An endpoint replaces the config's local servers: the command line
    then points the recipe at another server instead of starting its own."""
    given = {key: value for key, value in overrides.items() if value is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(BenchConfig)}
    if unknown:
        raise ValueError(f"not a bench setting: {', '.join(sorted(unknown))}")
    if given.get("endpoint"):
        given["servers"] = []
    return dataclasses.replace(config, **given)
