"""A checkpoint's config.json as the engine reads it, in one place for the engine, the loader and the
weights.

A Llama config with the default rotary embedding is read as the file's own fields over LlamaConfig's
defaults for the few a file may leave out: importing transformers' LlamaConfig pulls in torch._dynamo and
torch.distributed.tensor (1.3 s of a 5.7 s warm `llmopt serve` start on a 2-core Zen 4), and the engine
reads none of what that class adds. Every other config (Gemma 3, the MoE families, scaled rotary
embeddings, which transformers' own rope functions read) goes through AutoConfig."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PretrainedConfig

# transformers 5.17's LlamaConfig defaults for the fields the engine reads that a config.json may omit.
LLAMA_DEFAULTS = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def read_model_config(model_dir: Path) -> PretrainedConfig:
    fields = json.loads((Path(model_dir) / "config.json").read_text())
    rope_type = (fields.get("rope_parameters") or {}).get("rope_type", "default")
    if fields.get("model_type") != "llama" or fields.get("rope_scaling") or rope_type != "default":
        from transformers import AutoConfig  # its own import is 0.3 s of configuration_auto's tables

        return AutoConfig.from_pretrained(model_dir)
    config = PretrainedConfig.from_dict({**LLAMA_DEFAULTS, **fields})
    # As LlamaConfig.__post_init__ derives them.
    config.head_dim = fields.get("head_dim") or config.hidden_size // config.num_attention_heads
    config.num_key_value_heads = fields.get("num_key_value_heads") or config.num_attention_heads
    return config
