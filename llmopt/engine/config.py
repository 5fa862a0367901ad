from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """Settings of one engine instance; names follow vLLM's where vLLM has the same knob."""

    model: str | None = None  # a HF folder, a .gguf file or the default alias; None = the default model
    dtype: str = "float32"  # fp32 is fastest on CPUs without native bf16
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings, capped at 8192
    enable_prefix_caching: bool = True
    seed: int = 0  # seeds requests that give no seed of their own
    # vLLM-style: {"method": "ngram"|"draft", "num_speculative_tokens": k, ...} (dict or JSON text)
    speculative_config: dict | str | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
