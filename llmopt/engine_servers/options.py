"""The serve options every engine is given, llmopt's own among them: `llmopt serve`'s flags (vLLM's
names) with their defaults. An engine translates the ones it has; one it lacks is an error only when set
away from its default."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from llmopt.engine.config import EngineConfig
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine_servers.engine_error import EngineError

API_KEY_ENV = "LLMOPT_API_KEY"  # where `llmopt serve` (and llama.cpp's launcher) read the API key

# Which part of llmopt's own serving takes an option (llmopt serve on its engine, cli/serve.py): the
# engine's EngineConfig, the API's ServerSettings, or the Listener uvicorn binds; none: peers only.
ENGINE, API, LISTENER = "engine", "api", "listener"


def option(default: object, part: str | None = None) -> Any:
    return field(default=default, metadata={"part": part})


def engine_option(name: str) -> Any:
    """An option llmopt's engine takes, with EngineConfig's default (`LLM(...)`'s): written once there,
    so `llmopt serve model` runs as `LLM(model)` does."""
    return option(getattr(EngineConfig, name), ENGINE)


@dataclass
class ServeOptions:
    """Every serve option with its default (the engine's from EngineConfig, the rest written here only):
    `llmopt serve`'s flags default to these (cli/serve.py), a recipe's `[[serve]] args` override them,
    and each engine translates them."""

    model: str | None = engine_option("model")
    host: str = option("127.0.0.1", LISTENER)
    port: int = option(8000, LISTENER)
    served_model_name: str | None = option(None)  # the API's name: the model's when None (cli/serve.py)
    api_key: str | None = option(None, API)
    max_num_seqs: int = engine_option("max_num_seqs")
    max_num_batched_tokens: int = engine_option("max_num_batched_tokens")
    block_size: int = engine_option("block_size")
    num_kv_blocks: int | None = engine_option("num_kv_blocks")
    kv_cache_memory_gb: float | None = engine_option("kv_cache_memory_gb")
    enable_prefix_caching: bool = engine_option("enable_prefix_caching")
    max_model_len: int | None = engine_option("max_model_len")
    dtype: str = engine_option("dtype")  # each checkpoint in its own format (llmopt/engine/precision.py)
    max_queue_len: int = option(256, API)
    max_request_bytes: int = option(4 * 2**20, API)
    limit_concurrency: int = option(1024, LISTENER)
    timeout_keep_alive: float = option(5.0, LISTENER)
    speculative_config: str | dict | None = engine_option("speculative_config")
    tensor_parallel_size: int = option(1)
    pipeline_parallel_size: int = option(1)
    data_parallel_size: int = option(1)
    # llmopt's own (keyword only in cli/serve.py): no peer has them
    inflight_prefix_sharing: bool = engine_option("inflight_prefix_sharing")
    kv_cache_dtype: str = engine_option("kv_cache_dtype")  # llmopt's "int8"; peers: not translated
    lm_head_dtype: str = engine_option("lm_head_dtype")  # llmopt's int8 output layer
    kv_disk_gb: float | None = engine_option("kv_disk_gb")  # llmopt's KV disk tier (engine/kv_disk_tier.py)
    disable_log_requests: bool = option(False, API)  # vLLM's name: no access-log line per request
    # No /reset_prefix_cache: anyone holding the key could otherwise flush every session's cached prefix
    # (vLLM serves it only in its development mode).
    disable_admin_routes: bool = option(False, API)

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

    def part(self, name: str) -> dict:
        """The options `name` (ENGINE, API or LISTENER) takes, by field name, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["part"] == name}

    def changed(self) -> list[str]:
        """The options set away from their defaults, by field name."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in ("model", "port", "host") and getattr(self, f.name) != f.default
        ]

    def speculative(self) -> SpeculativeConfig | None:
        """`speculative_config` read as llmopt's engine reads it (a flag gives JSON text, a recipe a
        table); None for "off" and for llmopt's own "auto", which a peer meets as its own default (no
        speculation)."""
        if self.speculative_config == "auto":
            return None
        try:
            return SpeculativeConfig.parse(self.speculative_config)
        except ValueError as exc:
            raise EngineError(f"--speculative-config: {exc}") from None


def flag(name: str) -> str:
    """'max_num_seqs' -> '--max-num-seqs': how an option is named to the user."""
    return "--" + name.replace("_", "-")


def refuse_unmapped(options: ServeOptions, engine: str, mapped: set[str]) -> None:
    """An EngineError naming every option set away from its default that `engine` has no equivalent of."""
    missing = [name for name in options.changed() if name not in mapped]
    if missing:
        names = ", ".join(flag(name) for name in missing)
        raise EngineError(f"{names}: no equivalent on {engine} (leave it at its default for this engine)")
