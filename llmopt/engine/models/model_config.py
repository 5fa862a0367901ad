"""A checkpoint's config as the engine reads it (a folder's config.json, or a GGUF file's metadata as
the same fields), in one place for the engine, the loader and the weights.

A Llama config with the default rotary embedding is read as the file's own fields over LlamaConfig's
defaults for the few a file may leave out: importing transformers' LlamaConfig pulls in torch._dynamo and
torch.distributed.tensor (1.3 s of a 5.7 s warm `llmopt serve` start on a 2-core Zen 4), and the engine
reads none of what that class adds. A GGUF's Llama, Qwen2 or Qwen3 fields (gguf_model.py writes every
field the engine reads) are read the same way: AutoConfig's Qwen2Config import alone took 1.7 s of a
2.9 s model load here. Every other config (Gemma 3, the MoE families, scaled rotary embeddings, which
transformers' own rope functions read) goes through AutoConfig."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PretrainedConfig

from llmopt.checkpoints import is_gguf
from llmopt.gguf_file import read_gguf_file
from llmopt.gguf_model import config_fields

# Model types read without their transformers config class: Llama from any checkpoint, the others
# from a GGUF's complete fields.
PLAIN_TYPES = ("llama",)
PLAIN_GGUF_TYPES = ("llama", "qwen2", "qwen3")
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


def checkpoint_fields(checkpoint: Path) -> dict:
    """config.json's fields, or a GGUF's metadata as those fields (0.08 s for a 1.1 GB file here)."""
    checkpoint = Path(checkpoint)
    if is_gguf(checkpoint):
        return config_fields(read_gguf_file(checkpoint))
    return json.loads((checkpoint / "config.json").read_text())


def read_model_config(checkpoint: Path) -> PretrainedConfig:
    fields = checkpoint_fields(checkpoint)
    rope_type = (fields.get("rope_parameters") or {}).get("rope_type", "default")
    plain = PLAIN_GGUF_TYPES if is_gguf(Path(checkpoint)) else PLAIN_TYPES
    if fields.get("model_type") not in plain or fields.get("rope_scaling") or rope_type != "default":
        from transformers import AutoConfig  # its own import is 0.3 s of configuration_auto's tables

        if is_gguf(Path(checkpoint)):
            return AutoConfig.for_model(**fields)
        return AutoConfig.from_pretrained(checkpoint)
    config = PretrainedConfig.from_dict({**LLAMA_DEFAULTS, **fields})
    # As LlamaConfig.__post_init__ derives them.
    config.head_dim = fields.get("head_dim") or config.hidden_size // config.num_attention_heads
    config.num_key_value_heads = fields.get("num_key_value_heads") or config.num_attention_heads
    return config
