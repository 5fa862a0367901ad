"""A bench run: the matrix of server configs x workloads x load points, run point by point.

Every finished request is appended to `<run>/requests.jsonl` at once and every finished point to
`<run>/summary.json` and `summary.csv`, so a crash or Ctrl-C keeps all finished work and `--resume`
continues with the points not yet done. Local server configs (`[[serve]]` in a recipe) are started
with `llmopt serve` on a free port and stopped by pid, also when interrupted.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from llmopt.bench import workload as wl
from llmopt.bench.client import BenchRequest, Target
from llmopt.bench.launcher import LocalServer, llmopt_serve_command
from llmopt.bench.metrics import DEFAULT_PERCENTILES, parse_slo, summarize
from llmopt.bench.runner import LoadPoint, run_point

WORKLOADS = ("random", "shared-prefix", "copy", "file")


class BenchError(Exception):
    """A bench setting that cannot run; the message says what to fix."""


@dataclass
class ServerSpec:
    """A local `llmopt serve` config: a name and its CLI flags ({"max-num-seqs": 16, ...})."""

    name: str
    model: str | None = None
    args: dict = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        flags: list[str] = [self.model] if self.model else []
        for key, value in self.args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                flags.append(flag)
            elif value is False:
                flags.append("--no-" + flag[2:])
            elif isinstance(value, (dict, list)):
                flags += [flag, json.dumps(value)]
            else:
                flags += [flag, str(value)]
        return llmopt_serve_command(port, flags)


@dataclass
class BenchConfig:
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
    recipe: str | None = None

    def validate(self) -> None:
        if not self.endpoint and not self.servers:
            raise BenchError(
                "give --endpoint URL (any OpenAI-compatible server) or a --recipe with [[serve]] configs"
            )
        if self.api not in ("chat", "completions"):
            raise BenchError("--api must be 'chat' or 'completions'")
        if self.workload not in WORKLOADS:
            raise BenchError(f"--workload must be one of {', '.join(WORKLOADS)}")
        if self.workload == "file" and not self.dataset:
            raise BenchError("the 'file' workload needs --dataset FILE (JSONL or ShareGPT JSON)")
        if not self.concurrencies and not self.request_rates:
            self.concurrencies = [1]
        if any(c < 1 for c in self.concurrencies) or any(r <= 0 for r in self.request_rates):
            raise BenchError("concurrency must be >= 1 and request rates > 0")
        if any(n < 1 for n in self.prompt_lens + self.output_lens) or self.num_requests < 1:
            raise BenchError("prompt and output lengths and --num-requests must be >= 1")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate <= 1:
            raise BenchError("--max-error-rate is a fraction between 0 and 1")
        try:
            parse_slo(self.slo)
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    def load_points(self) -> list[LoadPoint]:
        common = {
            "num_requests": self.num_requests,
            "max_seconds": self.max_seconds,
            "warmup": self.warmup,
            "max_error_rate": self.max_error_rate,
            "seed": self.seed,
        }
        points = [LoadPoint(concurrency=c, **common) for c in self.concurrencies]
        points += [
            LoadPoint(request_rate=r, arrival=self.arrival, max_concurrency=self.max_concurrency, **common)
            for r in self.request_rates
        ]
        return points


def load_recipe(path: Path) -> BenchConfig:
    """A recipe TOML: [target], [[serve]], [workload], [load] tables (see recipes/*.toml)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BenchError(f"recipe not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BenchError(f"{path}: {exc}") from None
    target, load, work = data.get("target", {}), data.get("load", {}), data.get("workload", {})

    def as_list(value, default):
        if value is None:
            return default
        return value if isinstance(value, list) else [value]

    try:
        config = BenchConfig(
            endpoint=target.get("endpoint"),
            model=target.get("model"),
            api_key=target.get("api_key"),
            api=target.get("api", "chat"),
            servers=[
                ServerSpec(s.get("name", f"serve-{i}"), s.get("model"), s.get("args", {}))
                for i, s in enumerate(data.get("serve", []))
            ],
            workload=work.get("kind", "random"),
            prompt_lens=as_list(work.get("prompt_len"), [128]),
            output_lens=as_list(work.get("output_len"), [128]),
            prefix_len=work.get("prefix_len", 0),
            num_prefixes=work.get("num_prefixes", 1),
            dataset=work.get("dataset"),
            concurrencies=as_list(load.get("concurrency"), []),
            request_rates=as_list(load.get("request_rate"), []),
            arrival=load.get("arrival", "poisson"),
            max_concurrency=load.get("max_concurrency"),
            num_requests=load.get("num_requests", 64),
            max_seconds=load.get("max_seconds"),
            warmup=load.get("warmup", 2),
            slo=load.get("slo"),
            max_error_rate=load.get("max_error_rate"),
            recipe=str(path),
        )
    except TypeError as exc:
        raise BenchError(f"{path}: {exc}") from None
    return config


def first_model(endpoint: str, api_key: str | None) -> str:
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


def make_requests(
    config: BenchConfig, tokenizer, prompt_len: int, output_len: int, seed: int, num: int | None = None
) -> list[BenchRequest]:
    n = num or config.num_requests
    if config.workload == "shared-prefix":
        return wl.shared_prefix_prompts(
            tokenizer, n, config.prefix_len or prompt_len, config.num_prefixes, prompt_len, output_len, seed
        )
    if config.workload == "copy":
        return wl.copy_heavy_prompts(tokenizer, n, prompt_len, output_len, seed)
    if config.workload == "file":
        return wl.file_prompts(Path(config.dataset), tokenizer, output_len, n)
    return wl.random_prompts(tokenizer, n, prompt_len, output_len, seed)


def point_key(server: str, prompt_len: int, output_len: int, point: LoadPoint) -> str:
    return f"{server}|prompt={prompt_len}|output={output_len}|{point.label}"


CSV_FIELDS = [
    "server",
    "prompt_len",
    "output_len",
    "load",
    "requests",
    "successful",
    "failed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "goodput",
]


@dataclass
class RunDir:
    path: Path

    @property
    def records(self) -> Path:
        return self.path / "requests.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    def load_summaries(self) -> list[dict]:
        return json.loads(self.summary.read_text())["points"] if self.summary.is_file() else []

    def write_summaries(self, points: list[dict], settings: dict) -> None:
        self.summary.write_text(json.dumps({"settings": settings, "points": points}, indent=2))
        metric_cols = (
            [
                f"{m}_{s}"
                for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
                for s in ["mean", "median"] + [k for k in points[0]["ttft_ms"] if k.startswith("p")]
            ]
            if points
            else []
        )
        with open(self.path / "summary.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_FIELDS + metric_cols)
            for p in points:
                row = [p.get(k) for k in CSV_FIELDS]
                row += [p[m.rsplit("_", 1)[0]][m.rsplit("_", 1)[1]] for m in metric_cols]
                writer.writerow(row)

    def keep_records_of(self, keys: set[str]) -> None:
        """On resume: drop the records of points that did not finish (they run again)."""
        if not self.records.is_file():
            return
        kept = [
            line for line in self.records.read_text().splitlines() if json.loads(line).get("point") in keys
        ]
        self.records.write_text("".join(line + "\n" for line in kept))


def machine_info() -> dict:
    import os

    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def run_sweep(
    config: BenchConfig,
    run_dir: Path,
    resume: bool,
    tokenizer,
    on_point_start: Callable[[str, LoadPoint], Callable] | None = None,
    on_point_done: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every point not yet done; return all point summaries of the run (old and new)."""
    config.validate()
    run = RunDir(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise BenchError(
            f"{run_dir} already holds a run: pass --resume to continue it, or another --run-name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    done = run.load_summaries() if resume else []
    done_keys = {p["key"] for p in done}
    run.keep_records_of(done_keys)
    slo = parse_slo(config.slo)
    settings = {
        "config": {k: v for k, v in asdict(config).items() if k != "api_key"},
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
    }
    targets: list[tuple[str, ServerSpec | None]] = [(s.name, s) for s in config.servers] or [
        ("endpoint", None)
    ]
    points = done[:]
    with open(run.records, "a") as records_out:
        for server_name, spec in targets:
            matrix = [
                (pl, ol, lp)
                for pl in config.prompt_lens
                for ol in config.output_lens
                for lp in config.load_points()
            ]
            todo = [
                (pl, ol, lp) for pl, ol, lp in matrix if point_key(server_name, pl, ol, lp) not in done_keys
            ]
            if not todo:
                continue
            server = (
                LocalServer(spec.command, ready_timeout_s=600, log_path=run_dir / f"server-{server_name}.log")
                if spec
                else None
            )
            try:
                if server is not None:
                    server.wait_ready()
                endpoint = server.url + "/v1" if server else config.endpoint
                model = config.model or first_model(endpoint, config.api_key)
                target = Target(endpoint, model, config.api, config.api_key, config.ignore_eos)
                for prompt_len, output_len, point in todo:
                    key = point_key(server_name, prompt_len, output_len, point)
                    # Fresh prompts for every point (and for its warm-up), so that no point is served
                    # from prefix-cache entries that an earlier point or the warm-up left behind.
                    point_seed = config.seed + 7919 * matrix.index((prompt_len, output_len, point))
                    requests = make_requests(config, tokenizer, prompt_len, output_len, point_seed)
                    if point.warmup:
                        point.warmup_requests = make_requests(
                            config, tokenizer, prompt_len, output_len, point_seed + 1, point.warmup
                        )
                    progress = on_point_start(key, point) if on_point_start else None
                    count = (lambda text: wl.count_tokens(tokenizer, text)) if tokenizer is not None else None
                    before = scrape_spec_counters(endpoint) if server is not None else None
                    result = asyncio.run(
                        run_point(target, requests, point, records_out, key, progress, count)
                    )
                    summary = summarize(result.records, result.wall_s, slo, config.percentiles)
                    if before is not None:
                        summary["spec"] = spec_delta(before, scrape_spec_counters(endpoint))
                    summary.update(
                        {
                            "key": key,
                            "server": server_name,
                            "model": model,
                            "endpoint": endpoint,
                            "prompt_len": prompt_len,
                            "output_len": output_len,
                            "load": point.label,
                            "concurrency": point.concurrency,
                            "request_rate": point.request_rate,
                            "server_args": spec.args if spec else None,
                            "stopped_early": result.stopped_early,
                        }
                    )
                    points.append(summary)
                    run.write_summaries(points, settings)
                    if on_point_done:
                        on_point_done(summary)
            finally:
                if server is not None:
                    server.stop()
    return points


SPEC_COUNTERS = {
    "drafts": "llmopt:spec_decode_num_drafts_total",
    "draft_tokens": "llmopt:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llmopt:spec_decode_num_accepted_tokens_total",
}


def scrape_spec_counters(endpoint: str) -> dict[str, float]:
    """A local llmopt server's speculative-decoding counters (empty when it has none)."""
    try:
        text = httpx.get(endpoint.removesuffix("/v1") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    values = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        for key, metric in SPEC_COUNTERS.items():
            if name == metric:
                values[key] = float(line.rsplit(" ", 1)[1])
    return values


def spec_delta(before: dict[str, float], after: dict[str, float]) -> dict | None:
    if not after or not after.get("drafts"):
        return None
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}
    delta["acceptance_rate"] = (
        delta["accepted_tokens"] / delta["draft_tokens"] if delta["draft_tokens"] else None
    )
    delta["mean_acceptance_length"] = (
        1 + delta["accepted_tokens"] / delta["drafts"] if delta["drafts"] else None
    )
    return delta
