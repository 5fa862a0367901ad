"""A Gemma 3 GGUF rebuilt as a transformers folder (fp32 safetensors, config, tokenizer): transformers'
own GGUF path mis-reads Gemma 3, so checkpoints.convert_gguf calls this instead. What llama.cpp's
converter changed is undone here; the tokenizer is rebuilt as Gemma's SentencePiece BPE."""

from __future__ import annotations

from pathlib import Path

from llmopt.gguf_file import VOCABULARY_KEYS, GGUFFile, read_gguf_file
from llmopt.gguf_names import GEMMA3_LAYER_NAMES, GLOBAL_NAMES


class NotGemma3Error(ValueError):
    """A tensor that is not part of Gemma 3's text decoder (checkpoints.py reports it as a ModelError)."""


def write_gemma3_folder(gguf_path: Path, folder: Path) -> None:
    """A Gemma 3 GGUF as an fp32 HF folder (config, tokenizer, safetensors). What llama.cpp's converter
    changed is undone: every norm weight (q/k norms too) carries +1 there; q/k rows are not permuted for
    Gemma (unlike Llama); the embedding is stored unscaled, as in transformers."""
    import torch
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig

    gguf = read_gguf_file(gguf_path, VOCABULARY_KEYS)
    tensors = {}
    for t in gguf.tensors.values():
        base, _, kind = (
            t.name.removesuffix(".weight").rpartition(".") if t.name.startswith("blk.") else ("", "", "")
        )
        name = GLOBAL_NAMES.get(t.name.removesuffix(".weight")) or (
            f"model.layers.{base.split('.')[1]}.{GEMMA3_LAYER_NAMES[kind]}"
            if kind in GEMMA3_LAYER_NAMES
            else None
        )
        if name is None:
            raise NotGemma3Error(f"{gguf_path}: tensor {t.name} is not part of Gemma 3's text decoder")
        weight = torch.from_numpy(dequantize(gguf.read(t.name), t.type).copy()).float().reshape(t.shape)
        tensors[name + ".weight"] = weight - 1.0 if t.name.endswith("norm.weight") else weight
    save_file(tensors, str(folder / "model.safetensors"))
    Gemma3TextConfig(**gemma3_config(gguf)).save_pretrained(folder)
    gemma3_tokenizer(gguf).save_pretrained(folder)


def gemma3_config(gguf: GGUFFile) -> dict:
    """config.json fields of a Gemma 3 GGUF's text model."""
    get = gguf.get
    hidden, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", hidden // heads)
    rope = {"rope_type": "default", "rope_theta": get("rope.freq_base", 1_000_000.0)}
    if get("rope.scaling.type") == "linear":  # Gemma 3 4B and larger stretch their global layers
        rope = {**rope, "rope_type": "linear", "factor": get("rope.scaling.factor")}
    token_id = {k: int(gguf.metadata[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "padding")}
    return dict(
        model_type="gemma3_text",
        vocab_size=gguf.tensors["token_embd.weight"].shape[0],
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
        tie_word_embeddings="output.weight" not in gguf.tensors,
        bos_token_id=token_id["bos"],
        eos_token_id=token_id["eos"],
        pad_token_id=token_id["padding"],
        architectures=["Gemma3ForCausalLM"],
    )


def gemma3_tokenizer(gguf: GGUFFile):
    """Gemma's SentencePiece BPE as a fast tokenizer: merges ranked by piece score, control and
    user-defined pieces matched whole, byte fallback, <bos> first (transformers' GGUF path builds a
    Unigram model from the same vocabulary, which splits words differently: " o" "ld" for " old").
    `gguf` must hold its vocabulary (VOCABULARY_KEYS)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import generate_merges

    meta = gguf.metadata
    tokens = meta["tokenizer.ggml.tokens"]
    scores, types = meta["tokenizer.ggml.scores"].tolist(), meta["tokenizer.ggml.token_type"].tolist()
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
    bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
    if meta.get("tokenizer.ggml.add_bos_token", True):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    ids = {k: int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("eos", "unknown", "padding")}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=tokens[ids["eos"]],
        unk_token=tokens[ids["unknown"]],
        pad_token=tokens[ids["padding"]],
    )
    if "tokenizer.chat_template" in meta:
        fast.chat_template = str(meta["tokenizer.chat_template"])
    return fast
