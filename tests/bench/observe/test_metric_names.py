"""Every engine's /metrics page into the bench's one set of server figures: pages as llmopt, vLLM and
llama.cpp write them (HELP and TYPE lines, labels, counters with `_total`), each read into the same
canonical fields, a figure an engine does not publish left None (never 0), and a point's preemptions
and prefix-cache hit rate from the counters' growth over it."""

from __future__ import annotations

import pytest

from llmopt.bench.observe.server_metrics import read_sample, summarize_samples, with_rates
from llmopt.bench.observe.server_stats import parse_metrics

# As `llmopt serve` writes its page (llmopt/server/metrics.py): llmopt's names and, where vLLM has the
# same metric, vLLM's too; the KV cache in blocks.
LLMOPT_PAGE = """# HELP llmopt:num_requests_running Requests in the running batch.
# TYPE llmopt:num_requests_running gauge
llmopt:num_requests_running{{model_name="tiny"}} 3.0
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="tiny"}} 3.0
# HELP llmopt:num_requests_waiting Requests waiting to be scheduled.
# TYPE llmopt:num_requests_waiting gauge
llmopt:num_requests_waiting{{model_name="tiny"}} 2.0
# HELP llmopt:kv_blocks_used KV cache blocks in use.
# TYPE llmopt:kv_blocks_used gauge
llmopt:kv_blocks_used{{model_name="tiny"}} 12.0
# HELP llmopt:kv_blocks_total KV cache blocks in the pool.
# TYPE llmopt:kv_blocks_total gauge
llmopt:kv_blocks_total{{model_name="tiny"}} 48.0
# HELP llmopt:prefix_cache_queries_total Prompt tokens looked up in the prefix cache.
# TYPE llmopt:prefix_cache_queries_total counter
llmopt:prefix_cache_queries_total{{model_name="tiny"}} {queries}
# HELP llmopt:prefix_cache_hits_total Prompt tokens served from the prefix cache.
# TYPE llmopt:prefix_cache_hits_total counter
llmopt:prefix_cache_hits_total{{model_name="tiny"}} {hits}
# HELP llmopt:num_preemptions_total Sequences preempted by recompute.
# TYPE llmopt:num_preemptions_total counter
llmopt:num_preemptions_total{{model_name="tiny"}} {preempted}
# HELP vllm:num_preemptions_total Sequences preempted by recompute.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="tiny"}} 999.0
"""

# vLLM 0.x's v1 engine: counters with their _created samples, an engine label, HELP of its own.
VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="Qwen/Qwen3-0.6B"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="Qwen/Qwen3-0.6B"}} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="Qwen/Qwen3-0.6B"}} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {queries}
vllm:prefix_cache_queries_created{{engine="0",model_name="Qwen/Qwen3-0.6B"}} 1.764e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {hits}
vllm:prefix_cache_hits_created{{engine="0",model_name="Qwen/Qwen3-0.6B"}} 1.764e+09
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {preempted}
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""

# An older vLLM: the KV cache and prefix-cache counters under their gpu_ names.
OLD_VLLM_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
"""

# llama.cpp's server (tools/server: server_task_result_metrics::to_metrics) as the peer llmopt runs it:
# no labels, prompt_tokens_total counting only the prompt tokens it computed, no KV cache gauge.
LLAMA_CPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {processed}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total {cached}
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2.5
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 3500
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 512
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 371.2
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 38.9
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 2.1
"""
# Builds before its removal also had the KV cache's used fraction.
OLD_LLAMA_CPP_LINES = """# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
"""

CANONICAL = ("running", "waiting", "kv_cache_usage", "prefix_hits", "prefix_queries", "preemptions_total")


def figures(page: str) -> dict:
    sample = read_sample(parse_metrics(page), 0.0)
    assert sample is not None
    return {"engine": sample.engine, **{f: getattr(sample, f) for f in CANONICAL}}


def test_each_engines_page_reads_into_the_same_figures():
    llmopt = figures(LLMOPT_PAGE.format(queries=100, hits=40, preempted=1))
    vllm = figures(VLLM_PAGE.format(queries=100, hits=40, preempted=1))
    llama = figures(LLAMA_CPP_PAGE.format(processed=60, cached=40) + OLD_LLAMA_CPP_LINES)
    same = {"running": 3, "waiting": 2, "kv_cache_usage": 0.25, "prefix_hits": 40, "prefix_queries": 100}
    assert llmopt == {"engine": "llmopt", **same, "preemptions_total": 1}  # llmopt's, not its vLLM alias
    assert vllm == {"engine": "vllm", **same, "preemptions_total": 1}
    assert llama == {"engine": "llama.cpp", **same, "preemptions_total": None}  # it has no such counter


def test_a_figure_an_engine_does_not_publish_stays_none():
    llama = figures(LLAMA_CPP_PAGE.format(processed=60, cached=40))  # today's llama.cpp: no KV gauge
    assert llama["kv_cache_usage"] is None and llama["preemptions_total"] is None
    assert (llama["running"], llama["waiting"]) == (3, 2)
    old = figures(OLD_VLLM_PAGE)
    assert (old["kv_cache_usage"], old["prefix_hits"], old["prefix_queries"]) == (0.5, 4, 10)
    assert old["waiting"] is None and old["preemptions_total"] is None
    assert (
        read_sample(
            parse_metrics("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4\n"), 0
        )
        is None
    )


@pytest.mark.parametrize(
    "page, counters",
    [
        (LLMOPT_PAGE, lambda n: {"queries": 100 * n, "hits": 40 * n, "preempted": 2 * n}),
        (VLLM_PAGE, lambda n: {"queries": 100 * n, "hits": 40 * n, "preempted": 2 * n}),
        (LLAMA_CPP_PAGE, lambda n: {"processed": 60 * n, "cached": 40 * n}),
    ],
    ids=["llmopt", "vllm", "llama.cpp"],
)
def test_a_points_hit_rate_and_preemptions_come_from_the_counters_growth(page, counters):
    """Scrapes at t = 0, 1, 2, 3: every interval looks up 100 prompt tokens and finds 40 (llama.cpp:
    computes 60, reuses 40) and preempts 2 requests where the engine counts them."""
    samples = with_rates([read_sample(parse_metrics(page.format(**counters(n))), float(n)) for n in range(4)])
    assert [s.prefix_cache_hit_rate for s in samples] == [None, 0.4, 0.4, 0.4]
    summary = summarize_samples([(samples, 3.0)])
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert (summary["running_max"], summary["waiting_max"]) == (3, 2)
    if "preempted" in counters(1):
        assert [s.preemptions for s in samples] == [None, 2, 2, 2] and summary["preemptions"] == 6
    else:
        assert summary["preemptions"] is None  # not 0: llama.cpp does not say
    assert summary["engine"] == samples[0].engine
