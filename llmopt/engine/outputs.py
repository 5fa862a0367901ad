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
    cached_tokens: int = 0  # of the prompt, from the prefix cache (either tier)
    disk_cached_tokens: int = 0  # of those, loaded from the disk tier
    error: str | None = None  # finish_reason "error": why this request alone failed
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asks for them
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token, on the first output only


@dataclass
class KVDiskStats:
    """The KV disk tier's counters since start-up and its size now (kv_disk_tier.py)."""

    blocks: int  # of this model on disk
    bytes_used: int  # by the whole tier folder
    budget_bytes: int
    blocks_queued: int  # evicted from the pool and copied out for writing
    blocks_written: int
    bytes_written: int
    writes_dropped: int  # the writer was too far behind
    write_errors: int
    blocks_read: int  # loaded into the pool
    bytes_read: int
    read_s: float
    blocks_missed: int  # on disk, but unreadable as the block (torn, corrupted): computed instead
    blocks_skipped: int  # on disk, but computing them was measured to be faster
    files_evicted: int  # over the budget
    read_s_per_block: float | None  # the estimates each restore is decided by
    prefill_s_per_block: float | None


@dataclass
class EngineStats:
    """Counters since start-up (for /metrics and benchmarks)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int  # either tier
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
    prefix_cache_disk_hits: int = 0  # of prefix_cache_hits, loaded from the disk tier
    kv_disk: KVDiskStats | None = None  # None: no disk tier
