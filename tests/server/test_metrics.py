"""The /metrics page `llmopt serve` writes, read as the bench reads it: the engine's figures under the
bench's canonical names, and the process's CPU seconds (process_cpu_seconds_total), from which a bench
run against this server from another machine gets its CPU time per token. A stub engine: no model."""

from __future__ import annotations

from prometheus_client import generate_latest

from llmopt.bench.observe.server_metrics import read_sample
from llmopt.bench.observe.server_stats import parse_metrics
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


def test_the_page_counts_ram_and_disk_hits_and_the_disk_tiers_traffic():
    from llmopt.engine.outputs import KVDiskStats

    class WithTier(StubEngine):
        def stats(self) -> EngineStats:
            s = super().stats()
            s.prefix_cache_disk_hits = 32
            s.kv_disk = KVDiskStats(
                *(7, 4096, 10**9, 9, 8, 7_000, 1, 0, 2, 1_500, 0.01, 1, 3, 0), 0.001, 0.01
            )
            return s

    values = parse_metrics(generate_latest(ServerMetrics(WithTier(), "tiny").registry).decode())
    assert values["llmopt:prefix_cache_hits_total"] == 40  # both tiers
    assert (
        values["llmopt:prefix_cache_ram_hits_total"] == 8
        and values["llmopt:prefix_cache_disk_hits_total"] == 32
    )
    assert (
        values["llmopt:kv_disk_blocks_written_total"] == 8
        and values["llmopt:kv_disk_bytes_written_total"] == 7_000
    )
    assert (
        values["llmopt:kv_disk_blocks_read_total"] == 2 and values["llmopt:kv_disk_bytes_read_total"] == 1_500
    )
    assert (
        values["llmopt:kv_disk_blocks_missed_total"] == 1
        and values["llmopt:kv_disk_blocks_skipped_total"] == 3
    )
    assert (values["llmopt:kv_disk_blocks"], values["llmopt:kv_disk_usage_bytes"]) == (7, 4096)
    assert "vllm:prefix_cache_disk_hits_total" not in values
    without = parse_metrics(generate_latest(ServerMetrics(StubEngine(), "tiny").registry).decode())
    assert without["llmopt:kv_disk_budget_bytes"] == 0 and without["llmopt:prefix_cache_ram_hits_total"] == 40
