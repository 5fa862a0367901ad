"""The /metrics page `llmopt serve` writes, read as the bench reads it: the engine's figures under the
bench's canonical names, and the process's CPU seconds (process_cpu_seconds_total), from which a bench
run against this server from another machine gets its CPU time per token. A stub engine: no model."""

from __future__ import annotations

from prometheus_client import generate_latest

from llmopt.bench.server_metrics import read_sample
from llmopt.bench.server_stats import parse_metrics
from llmopt.engine.outputs import EngineStats
from llmopt.server.metrics import ServerMetrics


class StubEngine:
    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=3,
            num_waiting=1,
            kv_blocks_used=12,
            kv_blocks_total=48,
            prefix_cache_queries=100,
            prefix_cache_hits=40,
            num_preemptions=2,
            prompt_tokens=100,
            generation_tokens=50,
            requests_finished=4,
            decode_weight_bytes=98_000_000,
        )


def test_the_page_has_the_engines_figures_and_the_processs_cpu_time():
    values = parse_metrics(generate_latest(ServerMetrics(StubEngine(), "tiny").registry).decode())
    assert values["process_cpu_seconds_total"] > 0
    sample = read_sample(values, 0.0)
    assert (sample.engine, sample.running, sample.waiting, sample.kv_cache_usage) == ("llmopt", 3, 1, 0.25)
    assert (sample.prefix_queries, sample.prefix_hits, sample.preemptions_total) == (100, 40, 2)
    assert values["llmopt:decode_weight_bytes"] == 98_000_000 and "vllm:decode_weight_bytes" not in values
