"""Each serving engine's /metrics names for the bench's one set of server figures, so that a point's
server side reads the same whichever engine served it: requests running and waiting, the KV cache's used
fraction (0-1), the prefix cache's hits and look-ups (in prompt tokens), preemptions, and the
speculation counters. A page is read with the names of the first engine whose prefix it has (llmopt's
own server also publishes vLLM's names, so llmopt's are tried first); a figure that engine does not
publish stays None, never 0.

    figure             llmopt                  vLLM                          llama.cpp
    running            llmopt:num_requests_    vllm:num_requests_running     llamacpp:requests_processing
                       running
    waiting            llmopt:num_requests_    vllm:num_requests_waiting     llamacpp:requests_deferred
                       waiting
    kv_cache_usage     llmopt:kv_blocks_used   vllm:kv_cache_usage_perc      llamacpp:kv_cache_usage_ratio
                       / kv_blocks_total       (older: gpu_cache_usage_perc) (builds before its removal)
    prefix_hits        llmopt:prefix_cache_    vllm:prefix_cache_hits_total  llamacpp:prompt_tokens_
                       hits_total              (older: gpu_prefix_cache_...) cached_total
    prefix_queries     llmopt:prefix_cache_    vllm:prefix_cache_queries_    prompt_tokens_total (which
                       queries_total           total                         leaves cached ones out)
                                                                             + prompt_tokens_cached_total
    preemptions_total  llmopt:num_preemptions_ vllm:num_preemptions_total    (none)
                       total
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """A figure read from a page: the sum of `names` (every one on the page), divided by the sum of
    `per` when given (a fraction from two counts)."""

    names: tuple[str, ...]
    per: tuple[str, ...] = ()

    def read(self, values: dict[str, float]) -> float | None:
        if any(name not in values for name in self.names + self.per):
            return None
        value = sum(values[name] for name in self.names)
        if not self.per:
            return value
        total = sum(values[name] for name in self.per)
        return value / total if total else None


def one_of(*names: str) -> tuple[Source, ...]:
    """A figure published under one name, or another in other versions (the first one found wins)."""
    return tuple(Source((name,)) for name in names)


# Each figure's sources in one engine's names, tried in order.
Names = dict[str, tuple[Source, ...]]

LLMOPT: Names = {
    "running": one_of("llmopt:num_requests_running"),
    "waiting": one_of("llmopt:num_requests_waiting"),
    "kv_blocks_used": one_of("llmopt:kv_blocks_used"),
    "kv_cache_usage": (Source(("llmopt:kv_blocks_used",), ("llmopt:kv_blocks_total",)),),
    "prefix_hits": one_of("llmopt:prefix_cache_hits_total"),
    "prefix_queries": one_of("llmopt:prefix_cache_queries_total"),
    "preemptions_total": one_of("llmopt:num_preemptions_total"),
    "spec_draft_tokens": one_of("llmopt:spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": one_of("llmopt:spec_decode_num_accepted_tokens_total"),
}
VLLM: Names = {
    "running": one_of("vllm:num_requests_running"),
    "waiting": one_of("vllm:num_requests_waiting"),
    "kv_cache_usage": one_of("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # 0-1 despite "perc"
    "prefix_hits": one_of("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_queries": one_of("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "preemptions_total": one_of("vllm:num_preemptions_total"),
    "spec_draft_tokens": one_of("vllm:spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": one_of("vllm:spec_decode_num_accepted_tokens_total"),
}
LLAMA_CPP: Names = {
    "running": one_of("llamacpp:requests_processing"),
    "waiting": one_of("llamacpp:requests_deferred"),
    "kv_cache_usage": one_of("llamacpp:kv_cache_usage_ratio"),
    "prefix_hits": one_of("llamacpp:prompt_tokens_cached_total"),
    # Its prompt-token counter counts only the tokens it computed: the look-ups are those plus the cached.
    "prefix_queries": (Source(("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")),),
    "spec_draft_tokens": one_of("llamacpp:spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": one_of("llamacpp:spec_decode_num_accepted_tokens_total"),
}
SGLANG: Names = {
    "running": one_of("sglang:num_running_reqs"),
    "waiting": one_of("sglang:num_queue_reqs"),
    "kv_cache_usage": one_of("sglang:token_usage"),
}
# (engine, the prefix its names start with, its names), in the order a page is tried.
ENGINES: tuple[tuple[str, str, Names], ...] = (
    ("llmopt", "llmopt:", LLMOPT),
    ("vllm", "vllm:", VLLM),
    ("llama.cpp", "llamacpp:", LLAMA_CPP),
    ("sglang", "sglang:", SGLANG),
)
FIGURES = tuple(dict.fromkeys(field for _, _, names in ENGINES for field in names))


def engine_of(values: dict[str, float]) -> tuple[str, Names] | None:
    """The engine whose names a parsed page has (its name and names); None for no serving engine's page."""
    for engine, prefix, names in ENGINES:
        if any(name.startswith(prefix) for name in values):
            return engine, names
    return None


def read_figures(values: dict[str, float]) -> tuple[str, dict[str, float | None]] | None:
    """The engine of a parsed page and every figure of FIGURES from it (None where it has none)."""
    found = engine_of(values)
    if found is None:
        return None
    engine, names = found
    figures = {}
    for field in FIGURES:
        read = (source.read(values) for source in names.get(field, ()))
        figures[field] = next((v for v in read if v is not None), None)
    return engine, figures
