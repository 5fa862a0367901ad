"""The report's quantization section: for a run whose `[[serve]]` configs quantize the model
(bench/servers/quantized_serve.py), each config's quality against its output throughput and against its
cost per 1M output tokens, with the Pareto front: the configs that no other config beats on both, i.e. the
quantizations worth deploying.

Quality is the mean KL divergence of the config's next-token distribution from the source's in float32
(from its quant_report.json): it sees errors that perplexity averages away. A run with a config whose
report has none (made before llmopt measured it, or with --no-kld) is compared on perplexity instead, so
that all its configs stand on one measure.

Throughput is the output tokens/s of the config's busiest point within the run's SLOs (the point the cost
section prices self-hosting at, cost/from_run.py), and cost that throughput on the cheapest GPU hour of
the pricing file."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from llmopt.cost.from_run import slo_point
from llmopt.pricing import PricingModel, Usage
from llmopt.report import plots
from llmopt.report.format import fmt, money
from llmopt.report.runs import Run

# What each quality measure is called on the axis and in the headings.
QUALITY_LABELS = {"kld": "mean KL divergence from the fp32 source", "perplexity": "perplexity"}
HEADERS = [
    *("server", "method", "size (MB)", "perplexity", "Δ perplexity (%)", "mean KLD", "out tok/s"),
    *("$ per 1M output tokens", "on the Pareto front", "throughput from"),
]


@dataclass
class QuantPoint:
    """One server config of a run: its quantization, quality, size and measured speed."""

    server: str
    method: str  # "none": the unquantized source
    size_mb: float | None
    perplexity: float | None
    perplexity_before: float | None  # the source model's, measured alike
    throughput: float | None  # output tokens/s at the point that prices it
    cost_per_1m: float | None  # dollars per 1M output tokens at that throughput
    basis: str  # which point gave the throughput, in words
    front_throughput: bool = False
    front_cost: bool = False
    kld: float | None = None  # mean KL divergence from the source in float32

    def quality(self, measure: str) -> float | None:
        return self.kld if measure == "kld" else self.perplexity

    @property
    def delta_pct(self) -> float | None:
        if self.perplexity is None or not self.perplexity_before:
            return None
        return (self.perplexity - self.perplexity_before) / self.perplexity_before * 100


@dataclass
class QuantizationSection:
    run: str
    pricing: str  # the GPU hour priced, in words
    quality: str  # what the quality axis measures, in words
    headers: list[str]
    rows: list[list[str]]
    figure: str  # base64 SVG
    answer: str


def on_front(points: list[tuple[float, float]]) -> list[bool]:
    """For each (x, y), whether it is on the Pareto front of higher x and lower y: no other point has
    an x as high and a y as low, one of them strictly better."""
    front = set(plots.pareto_front(points))
    return [p in front for p in points]


def cheapest_gpu(models: list[PricingModel]) -> PricingModel | None:
    gpus = [m for m in models if m.kind == "gpu-hour" and m.per_hour > 0]
    return min(gpus, key=lambda m: m.per_hour, default=None)


def measured(run: Run, server: str) -> tuple[float | None, str]:
    """The output tokens/s a config sustained within the SLOs (the busiest point of all when no point
    met them, said so), and how it was chosen."""
    points = [p for p in run.points if p.server == server]
    point, basis = slo_point(points)
    if point is None:
        busiest = max(points, key=lambda p: p.output_throughput or 0, default=None)
        if busiest is None:
            return None, "no point ran"
        return busiest.output_throughput, f"{basis}: its busiest point ({busiest.load})"
    return point.output_throughput, f"{point.load}: {basis}"


def quality_measure(points: list[QuantPoint]) -> str:
    """The quality axis: "kld" where every config with a quality figure has a KLD, else "perplexity"."""
    rated = [p for p in points if p.perplexity is not None or p.kld is not None]
    return "kld" if rated and all(p.kld is not None for p in rated) else "perplexity"


def quant_points(run: Run, gpu: PricingModel | None) -> list[QuantPoint]:
    """A QuantPoint for each config of the run's settings["quantization"], the Pareto fronts marked."""
    out = []
    for server, record in (run.settings.quantization or {}).items():
        throughput, basis = measured(run, server)
        cost = None
        if gpu is not None and throughput:
            # One output token as one "request": the GPU hour spread over the tokens it serves.
            cost = gpu.request_cost(Usage(0.0, 1.0), request_throughput=throughput) * 1e6
        out.append(
            QuantPoint(
                server,
                record.method or "?",
                record.size_after_mb,
                record.perplexity,
                record.perplexity_before,
                throughput,
                cost,
                basis,
                kld=record.kld_mean,
            )
        )
    mark_fronts(out)
    return out


def mark_fronts(points: list[QuantPoint]) -> None:
    """Set each point's front flags: of the points with a quality figure (quality_measure), those that no
    other beats on quality and throughput (higher), and on quality and cost (lower)."""
    measure = quality_measure(points)
    fast = [p for p in points if p.quality(measure) is not None and p.throughput]
    for p, front in zip(fast, on_front([(p.throughput, p.quality(measure)) for p in fast])):
        p.front_throughput = front
    priced = [p for p in fast if p.cost_per_1m is not None]
    for p, front in zip(priced, on_front([(-p.cost_per_1m, p.quality(measure)) for p in priced])):
        p.front_cost = front


def front_cell(point: QuantPoint) -> str:
    fronts = [name for name, on in (("throughput", point.front_throughput), ("cost", point.front_cost)) if on]
    return ", ".join(fronts) or "no"


def row(point: QuantPoint) -> list[str]:
    delta = point.delta_pct
    return [
        point.server,
        point.method,
        fmt(point.size_mb),
        fmt(point.perplexity, 3),
        "-" if delta is None else f"{delta:+.1f}",
        fmt(point.kld, 6),
        fmt(point.throughput),
        money(point.cost_per_1m),
        front_cell(point),
        point.basis,
    ]


def answer(points: list[QuantPoint]) -> str:
    """The sentence a reader wants: which configs are worth deploying."""
    front = [p for p in points if p.front_throughput or p.front_cost]
    if not front:
        measure = QUALITY_LABELS[quality_measure(points)]
        return f"No config has both a {measure} and a measured throughput: nothing to compare."
    names = ", ".join(f"{p.server} ({p.method})" for p in front)
    beaten = [p.server for p in points if p not in front]
    tail = f"; {', '.join(beaten)} lose to one of them on both" if beaten else ""
    return f"Worth deploying (on the Pareto front): {names}{tail}."


def quantization_section(run: Run, models: list[PricingModel]) -> QuantizationSection | None:
    """The section for `run`, or None when none of its configs was quantized."""
    records = run.settings.quantization or {}
    if not any(r.quantized for r in records.values()):
        return None
    gpu = cheapest_gpu(models)
    points = quant_points(run, gpu)
    pricing = f"{gpu.name} at ${gpu.per_hour:g}/h" if gpu else "no GPU-hour price in the pricing file"
    measure = quality_measure(points)
    svg = plots.quality_tradeoff(
        [p.server for p in points],
        [p.quality(measure) for p in points],
        QUALITY_LABELS[measure],
        [
            (
                "output tokens/s (higher is better)",
                [p.throughput for p in points],
                [p.front_throughput for p in points],
            ),
            (
                f"$ per 1M output tokens, {pricing} (lower is better)",
                [p.cost_per_1m for p in points],
                [p.front_cost for p in points],
            ),
        ],
    )
    return QuantizationSection(
        run.name,
        pricing,
        QUALITY_LABELS[measure],
        HEADERS,
        [row(p) for p in points],
        base64.b64encode(svg.encode()).decode(),
        answer(points),
    )


def quantization_sections(runs: list[Run], models: list[PricingModel]) -> list[QuantizationSection]:
    return [s for s in (quantization_section(run, models) for run in runs) if s is not None]
