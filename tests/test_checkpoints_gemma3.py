"""llmopt's own GGUF -> Gemma 3 conversion on a small synthetic file written the way llama.cpp's converter
writes one (llama.cpp's tensor names, +1 baked into every norm, no q/k permutation, a SentencePiece BPE
vocabulary): the folder it writes loads in transformers as the model it came from. No real weights."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

from llmopt.checkpoints import convert_gguf
from llmopt.gguf_names import GEMMA3_LAYER_NAMES

CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
PIECES = ["▁", "a", "b", "c", "ab", "▁a", "▁ab", "abc", "▁abc"]  # best score first, as SentencePiece ranks


def write_gemma3_gguf(
    path,
    model: torch.nn.Module,
    config: Gemma3TextConfig,
    qtypes: dict[str, GGMLQuantizationType] | None = None,
) -> None:
    """`qtypes`: llama.cpp's short tensor name ("attn_q", "token_embd") -> the type it is written as
    (fp32 where none is given)."""
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(config.sliding_window)
    tokens = CONTROL + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [TokenType.CONTROL] * len(CONTROL) + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(PIECES)
    scores = [-1000.0] * len(CONTROL) + [0.0] * 256 + [-float(i) for i in range(len(PIECES))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    names = {v: k for k, v in GEMMA3_LAYER_NAMES.items()}
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy()
        if name.endswith("norm.weight"):
            data = data + 1.0  # as llama.cpp's converter writes Gemma's norms
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            continue  # tied
        else:
            layer, part = name.removeprefix("model.layers.").removesuffix(".weight").split(".", 1)
            gguf_name = f"blk.{layer}.{names[part]}.weight"
        qtype = (qtypes or {}).get(gguf_name.removesuffix(".weight").rpartition(".")[2])
        if qtype is None:
            writer.add_tensor(gguf_name, np.ascontiguousarray(data))
        else:
            writer.add_tensor(gguf_name, quantize(np.ascontiguousarray(data), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_gemma3_config(hidden_size: int, head_dim: int) -> Gemma3TextConfig:
    """Two layers, GQA, an 8-token window, over the tokenizer write_gemma3_gguf writes."""
    return Gemma3TextConfig(
        vocab_size=len(CONTROL) + 256 + len(PIECES),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        sliding_window=8,
        max_position_embeddings=128,
    )


def test_gemma3_gguf_converts_to_the_model_it_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = tiny_gemma3_config(hidden_size=32, head_dim=16)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param))
    write_gemma3_gguf(tmp_path / "tiny-gemma3.gguf", model, config)

    folder = convert_gguf(tmp_path / "tiny-gemma3.gguf")
    converted = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert converted.config.model_type == "gemma3_text"
    assert converted.config.layer_types == config.layer_types
    assert converted.config.rope_parameters == config.rope_parameters
    assert converted.config.query_pre_attn_scalar == config.head_dim
    expected = model.state_dict()
    for name, tensor in converted.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], msg=name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.encode("abc ab<start_of_turn>c")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "abc", "▁ab", "<start_of_turn>", "c"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "abc abc"
