"""The serve options every engine is given: `llmopt serve`'s flags (vLLM's names) with its defaults. An
engine translates the ones it has; one it lacks is an error only when set away from its default."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from llmopt.engines.errors import EngineError


@dataclass
class ServeOptions:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    dtype: str = "auto"  # each checkpoint in its own format (llmopt/engine/precision.py)
    max_queue_len: int = 256
    max_request_bytes: int = 4 * 2**20
    limit_concurrency: int = 1024
    timeout_keep_alive: float = 5.0
    speculative_config: str | dict | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    inflight_prefix_sharing: bool = True  # llmopt's own: no peer has it (keyword only in cli/serve.py)
    kv_cache_dtype: str = "auto"  # llmopt's "int8" (keyword only in cli/serve.py); peers: not translated
    lm_head_dtype: str = "auto"  # llmopt's int8 output layer (keyword only in cli/serve.py)

    @classmethod
    def from_args(cls, model: str | None, args: dict, port: int) -> ServeOptions:
        """From a recipe's `[[serve]] args` ({"max-num-seqs": 16, ...}); an unknown key is an error."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"model", "port"}
        values = {}
        for key, value in args.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise EngineError(f"unknown serve flag --{name.replace('_', '-')}")
            values[name] = value
        return cls(model=model, port=port, **values)

    def changed(self) -> list[str]:
        """The options set away from their defaults, by field name."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in ("model", "port", "host") and getattr(self, f.name) != f.default
        ]

    def speculative(self) -> dict | None:
        """`speculative_config` as a dict (a flag gives JSON text, a recipe a table)."""
        value = self.speculative_config
        if value is None or value == "":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise EngineError(f"--speculative-config is not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict) or value.get("method") not in ("ngram", "draft"):
            raise EngineError('--speculative-config needs "method": "ngram" or "draft"')
        if not isinstance(value.get("num_speculative_tokens"), int):
            raise EngineError("--speculative-config needs an integer num_speculative_tokens")
        return value


def flag(name: str) -> str:
    """'max_num_seqs' -> '--max-num-seqs': how an option is named to the user."""
    return "--" + name.replace("_", "-")


def refuse_unmapped(options: ServeOptions, engine: str, mapped: set[str]) -> None:
    """An EngineError naming every option set away from its default that `engine` has no equivalent of."""
    missing = [name for name in options.changed() if name not in mapped]
    if missing:
        names = ", ".join(flag(name) for name in missing)
        raise EngineError(f"{names}: no equivalent on {engine} (leave it at its default for this engine)")
