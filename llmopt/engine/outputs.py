"""What the engine hands out: per-request outputs of a step, and its counters."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.engine.token_logprobs import TokenLogprob


@dataclass
class RequestOutput:
    """What one engine step produced for one request: a text delta and, at the end, the totals."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None  # finish_reason "error": why this request alone failed
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asks for them
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token, on the first output only


@dataclass
class EngineStats:
    """Counters since start-up (for /metrics and benchmarks)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    requests_finished: int  # with finish_reason stop or length
    spec_drafts: int = 0  # verification steps with at least one proposed token
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_forced_tokens: int = 0  # accepted proposals a grammar forced (also in the two counts above)
    spec_acceptance_by_position: list[float] | None = None
    spec_mean_acceptance_length: float = 0.0
    decode_weight_bytes: int = 0  # weights one decode step reads (models/decode_reads.py)
