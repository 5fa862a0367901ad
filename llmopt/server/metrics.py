"""Prometheus metrics: engine gauges and counters read at scrape time, request latency histograms."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.outputs import EngineStats

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1,
    2.5,
    5,
    10,
    20,
    40,
    80,
)


# Every metric is exported under llmopt's prefix and, where vLLM has the same metric, under vLLM's name
# too, so GuideLLM's server-metrics scrape and vLLM's Grafana dashboards read llmopt unchanged.
PREFIXES = ("llmopt", "vllm")
LLMOPT_ONLY = {
    "kv_blocks_used",
    "kv_blocks_total",
    "spec_decode_mean_acceptance_length",
    "decode_weight_bytes",
}


def engine_values(s: EngineStats) -> list[tuple]:
    """(metric family, name, help, value) of every engine counter and gauge."""
    return [
        (GaugeMetricFamily, "num_requests_running", "Requests in the running batch.", s.num_running),
        (GaugeMetricFamily, "num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
        (GaugeMetricFamily, "kv_blocks_used", "KV cache blocks in use.", s.kv_blocks_used),
        (GaugeMetricFamily, "kv_blocks_total", "KV cache blocks in the pool.", s.kv_blocks_total),
        (
            CounterMetricFamily,
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queries,
        ),
        (
            CounterMetricFamily,
            "prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            s.prefix_cache_hits,
        ),
        (CounterMetricFamily, "num_preemptions", "Sequences preempted by recompute.", s.num_preemptions),
        (CounterMetricFamily, "prompt_tokens", "Prompt tokens of finished requests.", s.prompt_tokens),
        (CounterMetricFamily, "generation_tokens", "Generated tokens.", s.generation_tokens),
        (
            CounterMetricFamily,
            "request_success",
            "Requests finished (stop or length).",
            s.requests_finished,
        ),
        (CounterMetricFamily, "spec_decode_num_drafts", "Speculative verification steps.", s.spec_drafts),
        (CounterMetricFamily, "spec_decode_num_draft_tokens", "Proposed tokens.", s.spec_draft_tokens),
        (
            CounterMetricFamily,
            "spec_decode_num_accepted_tokens",
            "Accepted proposed tokens.",
            s.spec_accepted_tokens,
        ),
        (
            CounterMetricFamily,
            "spec_decode_num_forced_tokens",
            "Accepted proposed tokens that a structured output's grammar forced.",
            s.spec_forced_tokens,
        ),
        (
            GaugeMetricFamily,
            "spec_decode_mean_acceptance_length",
            "Tokens per verification step.",
            s.spec_mean_acceptance_length,
        ),
        (
            GaugeMetricFamily,
            "decode_weight_bytes",
            "Bytes of weights one decode step reads (layers and output layer as stored; no embedding).",
            s.decode_weight_bytes,
        ),
    ]


def disk_tier_values(s: EngineStats) -> list[tuple]:
    """(metric family, name, help, value) of the prefix cache's two tiers and the KV disk tier's traffic
    (zeros without a tier), llmopt's names only (engine/kv_disk_tier.py)."""
    d = s.kv_disk
    ram_hits = s.prefix_cache_hits - s.prefix_cache_disk_hits
    counters = [
        ("prefix_cache_ram_hits", "Prompt tokens served from the prefix cache's blocks in RAM.", ram_hits),
        ("prefix_cache_disk_hits", "Prompt tokens loaded from the KV disk tier.", s.prefix_cache_disk_hits),
        (
            "kv_disk_blocks_written",
            "KV blocks evicted from the pool and written to disk.",
            d and d.blocks_written,
        ),
        ("kv_disk_bytes_written", "Bytes of KV blocks written to disk.", d and d.bytes_written),
        ("kv_disk_blocks_read", "KV blocks loaded from disk into the pool.", d and d.blocks_read),
        ("kv_disk_bytes_read", "Bytes of KV blocks loaded from disk.", d and d.bytes_read),
        ("kv_disk_blocks_missed", "Block files torn or corrupted: computed instead.", d and d.blocks_missed),
        (
            "kv_disk_blocks_skipped",
            "Blocks on disk computed instead, reading measured slower than prefill.",
            d and d.blocks_skipped,
        ),
        (
            "kv_disk_writes_dropped",
            "Evicted blocks not written: the writer was behind.",
            d and d.writes_dropped,
        ),
    ]
    gauges = [
        ("kv_disk_blocks", "KV blocks of this model on disk.", d and d.blocks),
        ("kv_disk_usage_bytes", "Bytes the KV disk tier's folder holds.", d and d.bytes_used),
        ("kv_disk_budget_bytes", "The KV disk tier's bound (--kv-disk-gb); 0: off.", d and d.budget_bytes),
    ]
    return [(CounterMetricFamily, name, doc, value or 0) for name, doc, value in counters] + [
        (GaugeMetricFamily, name, doc, value or 0) for name, doc, value in gauges
    ]


class EngineCollector:
    def __init__(self, engine: LLMEngine, model_name: str):
        self.engine = engine
        self.labels = {"model_name": model_name}

    def describe(self):
        return []

    def family(self, kind, prefix: str, name: str, doc: str, value: float):
        family = kind(f"{prefix}:{name}", doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def collect(self):
        s = self.engine.stats()
        for kind, name, doc, value in engine_values(s):
            for prefix in PREFIXES if name not in LLMOPT_ONLY else PREFIXES[:1]:
                yield self.family(kind, prefix, name, doc, value)
        for kind, name, doc, value in disk_tier_values(s):
            yield self.family(kind, PREFIXES[0], name, doc, value)
        usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        yield self.family(GaugeMetricFamily, "vllm", "kv_cache_usage_perc", "KV cache usage (0-1).", usage)
        by_position = GaugeMetricFamily(
            "llmopt:spec_decode_acceptance_rate_by_position",
            "Share of proposals accepted at each position.",
            labels=[*self.labels, "position"],
        )
        for position, rate in enumerate(s.spec_acceptance_by_position or []):
            by_position.add_metric([*self.labels.values(), str(position)], rate)
        yield by_position


class BothNames:
    """A latency histogram under llmopt's and vLLM's name: one observe, both updated."""

    def __init__(self, registry: CollectorRegistry, name: str, doc: str, model_name: str):
        kw = {"labelnames": ["model_name"], "registry": registry, "buckets": LATENCY_BUCKETS}
        self.histograms = [Histogram(f"{prefix}:{name}", doc, **kw).labels(model_name) for prefix in PREFIXES]

    def observe(self, seconds: float) -> None:
        for histogram in self.histograms:
            histogram.observe(seconds)


class ServerMetrics:
    """One registry per app (no process-global state), so tests can run several servers."""

    def __init__(self, engine: LLMEngine, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, model_name))
        # process_cpu_seconds_total and the like, as a default Prometheus registry has them: a bench run
        # against this server from elsewhere reads its CPU time per token from them
        # (bench/observe/machine_meter.py).
        ProcessCollector(registry=self.registry)
        self.ttft = BothNames(
            self.registry, "time_to_first_token_seconds", "Time to first token.", model_name
        )
        self.itl = BothNames(self.registry, "inter_token_latency_seconds", "Time between tokens.", model_name)
        self.e2e = BothNames(self.registry, "e2e_request_latency_seconds", "End-to-end latency.", model_name)
