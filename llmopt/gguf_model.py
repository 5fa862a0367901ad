"""A GGUF file as a model checkpoint, from its header alone: the transformers config fields its
architecture's metadata keys describe, the tokenizer and chat template its `tokenizer.*` keys hold, and
the tokens that end a generation, as llama.cpp reads them. No weight is touched here.

transformers can build the same tokenizer (AutoTokenizer with gguf_file=), but for a Qwen2.5 file it
first reads every tensor (20.8 s for the 1.5B here) and its Qwen2 converter keeps only three of the
file's 22 control and user-defined tokens (`<tool_call>` came out as four pieces); its converters are
used below for the BPE model alone, with the special tokens, BOS and chat template set from the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmopt.gemma3_gguf import gemma3_config, gemma3_tokenizer
from llmopt.gguf_file import VOCABULARY_KEYS, GGUFError, GGUFFile, read_gguf_file

# general.architecture -> the transformers model_type llmopt's engine runs it as. GGUF files of Mistral
# and SmolLM models say "llama".
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
ARCHITECTURE_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# Token types of tokenizer.ggml.token_type: control tokens are special; user-defined ones (Qwen's
# <tool_call>) are matched whole wherever they appear, as llama.cpp's tokenizer does.
CONTROL, USER_DEFINED = 3, 4
# Tokens llama.cpp ends a generation on by their text (llama-vocab.cpp), beside the eos/eot/eom ids.
END_OF_GENERATION = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
)


def model_type(gguf: GGUFFile) -> str:
    """The engine's model type for the file, or a GGUFError naming what llmopt serves."""
    architecture = gguf.architecture
    if architecture not in MODEL_TYPES:
        raise GGUFError(
            f"{gguf.path}: architecture {architecture!r} is not supported; llmopt serves GGUF files of "
            f"{', '.join(MODEL_TYPES)} (Llama 2/3, Mistral, SmolLM, Qwen 2/2.5/3, Gemma 3)"
        )
    if gguf.get("expert_count"):
        raise GGUFError(f"{gguf.path}: a mixture-of-experts GGUF; llmopt serves MoE models from HF folders")
    return MODEL_TYPES[architecture]


def config_fields(gguf: GGUFFile) -> dict:
    """The file's model as config.json fields."""
    kind = model_type(gguf)
    if kind == "gemma3_text":
        return gemma3_config(gguf)
    hidden, heads = int(gguf.get("embedding_length")), int(gguf.get("attention.head_count"))
    head_dim = gguf.get("attention.key_length") or gguf.get("rope.dimension_count") or hidden // heads
    fields = {
        "model_type": kind,
        "architectures": [ARCHITECTURE_CLASSES[kind]],
        "vocab_size": gguf.tensors["token_embd.weight"].shape[0],
        "hidden_size": hidden,
        "intermediate_size": int(gguf.get("feed_forward_length")),
        "num_hidden_layers": int(gguf.get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gguf.get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(gguf.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(gguf.get("context_length", 4096)),
        "rope_theta": float(gguf.get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        **special_token_ids(gguf),
    }
    if gguf.get("rope.scaling.type") == "linear":
        fields["rope_scaling"] = {"rope_type": "linear", "factor": float(gguf.get("rope.scaling.factor"))}
    elif gguf.get("rope.scaling.type") not in (None, "none"):
        raise GGUFError(f"{gguf.path}: rope scaling {gguf.get('rope.scaling.type')!r} is not supported")
    return fields


def special_token_ids(gguf: GGUFFile) -> dict:
    keys = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "padding"}
    return {
        field: int(gguf.metadata[f"tokenizer.ggml.{key}_token_id"])
        for field, key in keys.items()
        if f"tokenizer.ggml.{key}_token_id" in gguf.metadata
    }


def end_of_generation_ids(gguf: GGUFFile, vocabulary: dict[str, int]) -> set[int]:
    """What llama.cpp stops on: the eos, eot and eom ids, and the tokens whose text ends a turn
    (Qwen2.5's <|im_end|> and <|endoftext|>, Llama 3's <|eot_id|>); `vocabulary` maps token text to id."""
    ids = {
        int(gguf.metadata[f"tokenizer.ggml.{key}_token_id"])
        for key in ("eos", "eot", "eom")
        if f"tokenizer.ggml.{key}_token_id" in gguf.metadata
    }
    return ids | {vocabulary[text] for text in END_OF_GENERATION if text in vocabulary}


def read_vocabulary(path: Path) -> GGUFFile:
    """The header with its tokens and merges read in full (0.3 s for a 151,936-token vocabulary)."""
    return read_gguf_file(path, VOCABULARY_KEYS)


def build_tokenizer(gguf: GGUFFile):
    """The file's tokenizer as a transformers fast tokenizer, with its chat template. `gguf` must hold
    its vocabulary (read_vocabulary)."""
    if model_type(gguf) == "gemma3_text":
        return gemma3_tokenizer(gguf)
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer

    meta = gguf.metadata
    tokens = meta["tokenizer.ggml.tokens"]
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(tokens), np.int32)))
    model = str(meta.get("tokenizer.ggml.model", "gpt2"))
    # Whether a word-initial space is prepended; llama.cpp's default: yes for SentencePiece vocabularies,
    # no for byte-level BPE ones (SmolLM2's file says no). The converter's default (yes) made every single
    # token's decode drop its leading space ("Once upon" token by token read "Onceupon").
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", model == "llama"))
    fields = {
        "tokens": tokens,
        "tokenizer_type": model,
        "token_type": types.tolist(),
        "add_prefix_space": prefix,
    }
    if "tokenizer.ggml.merges" in meta:
        fields["merges"] = meta["tokenizer.ggml.merges"]
    if "tokenizer.ggml.scores" in meta:
        fields["scores"] = np.asarray(meta["tokenizer.ggml.scores"]).tolist()
    converter = "qwen2" if gguf.architecture in ("qwen2", "qwen3") else "llama"
    backend, _ = convert_gguf_tokenizer(converter, fields)
    backend.add_special_tokens(
        [AddedToken(tokens[i], normalized=False, special=True) for i in where(types, CONTROL)]
    )
    backend.add_tokens([AddedToken(tokens[i], normalized=False) for i in where(types, USER_DEFINED)])
    ids = special_token_ids(gguf)
    bos = tokens[ids["bos_token_id"]] if "bos_token_id" in ids else None
    # llama.cpp prepends BOS unless the file says not to; SentencePiece vocabularies default to it.
    if bos is not None and meta.get("tokenizer.ggml.add_bos_token", model == "llama"):
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos_token_id"])]
        )
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=tokens[ids["eos_token_id"]] if "eos_token_id" in ids else None,
        pad_token=tokens[ids["pad_token_id"]] if "pad_token_id" in ids else None,
        unk_token=tokens[int(unk)] if unk is not None else None,
        model_max_length=int(gguf.get("context_length", 4096)),
    )
    if "tokenizer.chat_template" in meta:
        tokenizer.chat_template = str(meta["tokenizer.chat_template"])
    return tokenizer


def where(types: np.ndarray, kind: int) -> list[int]:
    return np.flatnonzero(types == kind).tolist()
