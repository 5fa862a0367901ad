from __future__ import annotations

from dataclasses import dataclass

KV_CACHE_DTYPES = ("auto", "int8")  # --kv-cache-dtype: "auto" = the model's dtype
# --dtype: "auto" is each checkpoint in its own format on this CPU's fastest exact kernel (precision.py)
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    """Settings of one engine instance; names follow vLLM's where vLLM has the same knob. The defaults
    are `LLM(...)`'s and `llmopt serve`'s (engine_servers/options.py reads them from here)."""

    model: str | None = None  # a HF folder, a .gguf file or the default alias; None = the default model
    # "auto": a GGUF's or compressed-tensors checkpoint's quantized weights as stored (fp32 activations),
    # a bf16/fp16 one as bf16 where the CPU has bf16 matmuls, else fp32; "float32" is the exact reference.
    dtype: str = "auto"
    lm_head_dtype: str = "auto"  # "float32" or "int8" (per output row); "auto": layers/lm_head.py
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_gb
    # None: a quarter of the memory free once the weights are in, 0.25-16 GiB (engine/memory.py)
    kv_cache_memory_gb: float | None = None
    # "auto": keys and values in the model's dtype; "int8": per token-head scales (layers/int8_kv_cache.py)
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings, capped at 8192
    enable_prefix_caching: bool = True
    # The prefix cache's second tier on local disk, under $LLMOPT_CACHE/kv (engine/kv_disk_tier.py), in
    # GB: None = 10 % of the disk free there, at most 20 GB; 0 = off.
    kv_disk_gb: float | None = None
    # A request whose prefix another is computing right now waits for those blocks instead of computing
    # them too (moot without prefix caching).
    inflight_prefix_sharing: bool = True
    seed: int = 0  # seeds requests that give no seed of their own
    # vLLM-style: {"method": "ngram"|"draft", "num_speculative_tokens": k, ...} (dict or JSON text), or
    # "auto" (prompt lookup paced by measured cost, greedy requests only; spec_decode/config.py) or "off".
    # auto by default: it never measured below 0.98x of off (benchmarks/real_model.py, docs/serve.md).
    speculative_config: dict | str | None = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValueError("kv_cache_memory_gb must be more than 0")
        if self.kv_disk_gb is not None and not self.kv_disk_gb >= 0:
            raise ValueError("kv_disk_gb must be 0 (off) or more")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, not {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto or int8, not {self.kv_cache_dtype!r}")
        if self.lm_head_dtype not in ("auto", "float32", "int8"):
            raise ValueError(f"lm_head_dtype must be auto, float32 or int8, not {self.lm_head_dtype!r}")
