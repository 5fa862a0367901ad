"""The engine reads a Llama config.json without transformers' LlamaConfig (whose import chain costs a
second of start-up) and gets the values LlamaConfig gives; anything else still goes through AutoConfig."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoConfig

from llmopt.engine.models.model_config import read_model_config

# Every config field the engine, the model and the loader read.
ENGINE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "rope_parameters",
)
OPTIONAL = (
    "head_dim",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
)


def engine_view(config) -> dict:
    view = {name: getattr(config, name) for name in ENGINE_FIELDS}
    params = view.pop("rope_parameters") or {}
    view["rope_theta"] = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return view


def with_config(folder: Path, fields: dict) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def test_a_llama_config_reads_as_llamaconfig_does(model_dir, tmp_path):
    assert engine_view(read_model_config(model_dir)) == engine_view(AutoConfig.from_pretrained(model_dir))
    fields = json.loads((model_dir / "config.json").read_text())
    sparse = with_config(tmp_path / "sparse", {k: v for k, v in fields.items() if k not in OPTIONAL})
    ours, theirs = read_model_config(sparse), AutoConfig.from_pretrained(sparse)
    assert engine_view(ours) == engine_view(theirs)
    assert (ours.num_key_value_heads, ours.tie_word_embeddings) == (fields["num_attention_heads"], False)


def test_other_configs_go_through_autoconfig(model_dir, tmp_path):
    fields = json.loads((model_dir / "config.json").read_text())
    llama3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    llama3 |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    scaled = with_config(tmp_path / "scaled", fields | {"rope_parameters": llama3})
    assert type(read_model_config(scaled)).__name__ == "LlamaConfig"
    qwen = with_config(tmp_path / "qwen", fields | {"model_type": "qwen2", "architectures": ["Qwen2"]})
    assert type(read_model_config(qwen)).__name__ == "Qwen2Config"


def test_serving_the_default_model_imports_no_autoconfig_dynamo_or_bench_client(model_dir):
    """What `llmopt serve` imports before its model loads, and what reading the model's config adds:
    none of the modules that cost its start-up 1.3 s (LlamaConfig's chain), 0.3 s (AutoConfig's tables)
    and 0.18 s (the bench's client) on a 2-core Zen 4."""
    code = (
        "import sys, llmopt.cli, llmopt.server.serve\n"
        "from llmopt.engine.models.model_config import read_model_config\n"
        f"read_model_config({str(model_dir)!r})\n"
        "heavy = ('torch._dynamo', 'transformers.models.auto.configuration_auto', 'aiohttp')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
