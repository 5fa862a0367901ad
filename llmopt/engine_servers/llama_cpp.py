"""llmopt's serve options as the llama.cpp launcher (llama_cpp_server.py, run by xllamacpp's Python)
takes them. llama.cpp has slots, not a paged pool: each of the `--max-num-seqs` slots gets
`--max-model-len` tokens of context, so the total context is their product."""

from __future__ import annotations

from pathlib import Path

from llmopt.checkpoints import served_name
from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.handoff import llama_cpp_model
from llmopt.engine_servers.options import API_KEY_ENV, ServeOptions, refuse_unmapped

ENGINE = "llama.cpp"
LAUNCHER = Path(__file__).with_name("llama_cpp_server.py")
SLOT_LEN = 2048  # context per slot when --max-model-len is not given (llama.cpp would split 8192 by slots)
# option -> launcher flag, given its value whenever it has one.
FLAGS = {
    "host": "--host",
    "port": "--port",
    "max_num_seqs": "--np",
    "max_num_batched_tokens": "--batch",
}
SPECIAL = {"served_model_name", "api_key", "enable_prefix_caching", "max_model_len", "speculative_config"}


def llama_cpp_command(options: ServeOptions, python: str) -> EngineCommand:
    refuse_unmapped(options, ENGINE, set(FLAGS) | SPECIAL)
    argv = [python, str(LAUNCHER), "--model", llama_cpp_model(options.model)]
    for option, launcher_flag in FLAGS.items():
        argv += [launcher_flag, str(getattr(options, option))]
    argv += ["--ctx", str(options.max_num_seqs * (options.max_model_len or SLOT_LEN))]
    argv += ["--alias", options.served_model_name or served_name(options.model)]
    if not options.enable_prefix_caching:
        argv.append("--no-cache-prompt")
    argv += speculative(options)
    env = {API_KEY_ENV: options.api_key} if options.api_key else {}  # the launcher reads it there
    return EngineCommand(ENGINE, argv, env, {API_KEY_ENV})


def speculative(options: ServeOptions) -> list[str]:
    """n-gram lookup (llama.cpp's ngram-simple: the n-gram length is llmopt's prompt_lookup_max) or a
    draft GGUF; num_speculative_tokens is the most tokens drafted a step either way."""
    spec = options.speculative()
    if spec is None:
        return []
    flags = ["--draft-max", str(spec.num_speculative_tokens)]
    if spec.method == "ngram":
        return [*flags, "--spec-ngram-size", str(spec.prompt_lookup_max)]
    return [*flags, "--spec-draft", llama_cpp_model(spec.model)]
