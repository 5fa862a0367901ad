"""Every bench setting, written once: a field of the recipe table it belongs to ([target], [workload],
[load]) with its default, and with its metadata (`Setting`): its help, its recipe key and its option's
name. The recipe is parsed (sweep/recipe.py) and `llmopt bench`'s options are made (cli/setting_options.py)
from these fields, so that a setting cannot be given one way and not the other. A list field is a sweep
axis: a recipe gives one value or a list, the command line a comma-separated list ("1,4,16").

Nothing is imported here beyond dataclasses: the command line reads these fields to build its options,
and its start-up must not pay for the bench."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Setting:
    """What is said of a setting besides its type and default."""

    help: str
    key: str | None = None  # its recipe key, when not the field's name (its option is named the same)
    option: str | None = None  # its option's name (without "--"), when not the recipe key
    # Its name where all settings are one flat list (a run's recorded settings, overrides), when not the
    # field's: the [workload] table's `kind` is recorded as "workload", as it was before the tables.
    name: str | None = None
    # Other names of the same setting, as recipe key and option alike: {name: what it is, for its help
    # and for the error when both are given}.
    aliases: dict[str, str] = field(default_factory=dict)
    envvar: str | None = None


def setting(default: object, help: str, **meta: Any) -> Any:
    """A bench setting's field: its default (a list's is copied for each config) and its metadata."""
    metadata = {"setting": Setting(help, **meta)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TargetSettings:
    """[target]: the server the load is sent to and how requests are made of it (or [[serve]] configs)."""

    endpoint: str | None = setting(
        None, "base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1"
    )
    model: str | None = setting(None, "model name; default: the first of /v1/models")
    api_key: str | None = setting(None, "API key (or $OPENAI_API_KEY)", envvar="OPENAI_API_KEY")
    api: str = setting("chat", "chat, completions, responses (chained by previous_response_id) or messages")
    quantized_cache: str | None = setting(
        None, "where `quantize` configs' checkpoints are cached; default ~/.cache/llmopt/quantized"
    )
    ignore_eos: bool = setting(True, "send ignore_eos so outputs have the asked length")


@dataclass
class WorkloadSettings:
    """[workload]: the requests, or the sessions of a multi-turn workload."""

    kind: str = setting(
        "random",
        "random, shared-prefix, copy, file, replay, multi-turn, agent or conversations",
        option="workload",
        name="workload",
    )
    prompt_lens: list[int] = setting(
        [128],
        "prompt lengths in tokens, e.g. 128,1024 (multi-turn workloads: the user or tool text of a turn)",
        key="prompt_len",
        aliases={"turn_len": "the multi-turn name"},
    )
    output_lens: list[int] = setting([128], "output lengths in tokens (max_tokens)", key="output_len")
    # 0: as long as the prompt (shared_prefix.py)
    prefix_len: int = setting(0, "shared-prefix length (shared-prefix workload); 0: the prompt length")
    num_prefixes: int = setting(1, "distinct shared prefixes")
    dataset: str | None = setting(None, "JSONL or ShareGPT JSON file (file and conversations workloads)")
    turns: int = setting(4, "turns per synthetic session")
    system_len: int = setting(256, "shared system prompt of the synthetic sessions, tokens")
    # prompt (or turn) lengths drawn uniformly from length * (1 +- this)
    prompt_len_spread: float = setting(0.0, "prompt lengths uniform in length * (1 +- this)")
    # The replay workload: a trace file (trace.py) and its block size.
    trace: str | None = setting(None, "replay workload: a trace, JSONL in the Mooncake trace format")
    trace_block_size: int = setting(512, "tokens per hash id of the trace (Mooncake's)")
    # The agent workload's tools: "api" sends them as `tools` (text once a server refuses them); "text"
    # writes them into the messages for every server alike, so that no engine's tool support counts.
    agent_tools: str = setting(
        "api",
        "agent workload: its tools sent as `tools` (api) or written into the messages (text)",
        key="tools",
        option="agent_tools",
    )
    tokenizer: str | None = setting(None, "tokenizer for prompt lengths (model or tokenizer folder, .gguf)")
    seed: int = setting(0, "seeds the prompts and the arrivals")


@dataclass
class LoadSettings:
    """[load]: the load points, how each is run, and what a point must meet."""

    concurrencies: list[int] = setting([], "fixed concurrency points, e.g. 1,4,16", key="concurrency")
    request_rates: list[float] = setting(
        [], "arrival-rate points in requests/s, e.g. 2,4", key="request_rate"
    )
    arrival: str = setting("poisson", "poisson or constant")
    max_concurrency: int | None = setting(None, "cap on in-flight requests for rate points")
    num_requests: int = setting(64, "requests per load point")
    max_seconds: float | None = setting(None, "stop sending after this long per point")
    warmup: int = setting(2, "uncounted warm-up requests per point")
    slo: str | None = setting(None, "goodput SLOs, e.g. ttft=500ms,tpot=50ms")
    percentiles: tuple[float, ...] = setting((50.0, 90.0, 99.0), "percentiles to report")
    max_error_rate: float | None = setting(None, "stop a point once this share fails")
    # False: a new connection per request, for servers that drop kept-alive connections without saying so
    # (xllamacpp's llama.cpp server after a stream); the bench never re-sends a request on a dead one.
    connection_reuse: bool = setting(
        True, "keep-alive connections; off for servers that drop them (llama.cpp's)"
    )
    request_timeout: float = setting(
        600.0, "fail a request once the server sends nothing for this many seconds"
    )
    # Multi-turn workloads (multi-turn, agent, conversations): sessions at once (rates are then sessions
    # started per second) and the pause between an answer and the next turn.
    sessions: list[int] = setting(
        [], "multi-turn workloads: sessions at once, one point each, e.g. 1,4; none given: 1"
    )
    think_time: float = setting(0.0, "seconds between an answer and the session's next turn")
    burstiness: float = setting(
        1.0, "gamma shape of Poisson arrivals (vllm bench serve's): 1 Poisson, < 1 burstier"
    )
    ramp_up: float = setting(0.0, "seconds over which a rate point's rate rises linearly from 0")
    streams: list[bool] = setting(
        [True], "stream answers; a recipe may sweep both: [true, false]", key="stream"
    )
    reset_prefix_cache: bool = setting(
        True, "POST /reset_prefix_cache before each point where the server has it"
    )
    # The highest load meeting these SLOs (search.py), from the one load point given as the first probe.
    goodput_search: str | None = setting(
        None, "find the highest load meeting these SLOs, e.g. ttft=500ms,tpot=50ms (doubling, bisection)"
    )
    search_percentile: float = setting(90.0, "the percentile at which the searched SLOs must hold")
    search_tolerance: float = setting(0.1, "a rate search stops within this share of its answer")
    num_runs: int = setting(1, "run each point this many times; summaries give 95 % intervals")
    rounds: int = setting(1, "recipe configs take turns: round 1 of each, then round 2 of each, ...")
    workers: int = setting(1, "client processes per point, for rates one event loop cannot drive")
    metrics_interval: float = setting(
        0.5, "seconds between samples of the server's /metrics during a point; 0: off"
    )
    replay_speeds: list[float] = setting(
        [],
        "replay the trace this many times as fast, one point each, e.g. 1,2; none given: 1",
        key="replay_speed",
    )
    stop_on_saturation: bool = setting(
        False, "end a point once its queue grows (arrivals outrun completions) and skip its higher loads"
    )


# The recipe's tables, by name, in the order the command line lists their options.
TABLES: dict[str, type] = {"target": TargetSettings, "workload": WorkloadSettings, "load": LoadSettings}


def setting_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """Every setting's field with the name of its table, table by table."""
    for table, settings in TABLES.items():
        for f in dataclasses.fields(settings):
            yield table, f


def setting_of(f: dataclasses.Field) -> Setting:
    return f.metadata["setting"]


def setting_name(f: dataclasses.Field) -> str:
    """The setting's name in the flat list of all of them (a run's recorded settings, overrides)."""
    return setting_of(f).name or f.name


def recipe_key(f: dataclasses.Field) -> str:
    """The setting's key in its recipe table."""
    return setting_of(f).key or f.name


def option_name(f: dataclasses.Field) -> str:
    """The setting's option without "--": its recipe key spelled as a flag ('num-requests')."""
    return (setting_of(f).option or recipe_key(f)).replace("_", "-")


def value_type(table: type, f: dataclasses.Field) -> Any:
    """The field's type, as a type (`list[int]`), not as the text this module's annotations are."""
    return type_hints(table)[f.name]


@functools.cache
def type_hints(table: type) -> dict[str, Any]:
    return typing.get_type_hints(table)  # evaluates every annotation of the table: once


def is_axis(table: type, f: dataclasses.Field) -> bool:
    """Whether the setting is a sweep axis: a list, one point (or one matrix row) per value."""
    return typing.get_origin(value_type(table, f)) is list
