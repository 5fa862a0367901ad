"""Prometheus metrics: engine gauges and counters read at scrape time, request latency histograms."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llmopt.engine.llm_engine import LLMEngine

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


class EngineCollector:
    def __init__(self, engine: LLMEngine, model_name: str):
        self.engine = engine
        self.labels = {"model_name": model_name}

    def describe(self):
        return []

    def collect(self):
        s = self.engine.stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"llmopt:{name}", doc, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"llmopt:{name}", doc, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), value)
            return family

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("kv_blocks_used", "KV cache blocks in use.", s.kv_blocks_used)
        yield gauge("kv_blocks_total", "KV cache blocks in the pool.", s.kv_blocks_total)
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries
        )
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.", s.prefix_cache_hits)
        yield counter("num_preemptions", "Sequences preempted by recompute.", s.num_preemptions)
        yield counter("prompt_tokens", "Prompt tokens of finished requests.", s.prompt_tokens)
        yield counter("generation_tokens", "Generated tokens.", s.generation_tokens)
        yield counter("request_success", "Requests finished (stop or length).", s.requests_finished)
        yield counter("spec_decode_num_drafts", "Speculative verification steps.", s.spec_drafts)
        yield counter("spec_decode_num_draft_tokens", "Proposed tokens.", s.spec_draft_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Accepted proposed tokens.", s.spec_accepted_tokens)
        yield gauge(
            "spec_decode_mean_acceptance_length",
            "Tokens per verification step.",
            s.spec_mean_acceptance_length,
        )
        by_position = GaugeMetricFamily(
            "llmopt:spec_decode_acceptance_rate_by_position",
            "Share of proposals accepted at each position.",
            labels=[*self.labels, "position"],
        )
        for position, rate in enumerate(s.spec_acceptance_by_position or []):
            by_position.add_metric([*self.labels.values(), str(position)], rate)
        yield by_position


class ServerMetrics:
    """One registry per app (no process-global state), so tests can run several servers."""

    def __init__(self, engine: LLMEngine, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, model_name))
        kw = {"labelnames": ["model_name"], "registry": self.registry, "buckets": LATENCY_BUCKETS}
        self.ttft = Histogram("llmopt:time_to_first_token_seconds", "Time to first token.", **kw).labels(
            model_name
        )
        self.itl = Histogram("llmopt:inter_token_latency_seconds", "Time between tokens.", **kw).labels(
            model_name
        )
        self.e2e = Histogram("llmopt:e2e_request_latency_seconds", "End-to-end latency.", **kw).labels(
            model_name
        )
