"""llama.cpp's GGUF tensor names -> transformers' (before ".weight"), for the engine's native GGUF reader
(engine/formats/gguf.py) and the Gemma 3 folder converter (gemma3_gguf.py), which must agree on them."""

from __future__ import annotations

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Per layer, the Llama family's (Mistral, Qwen 2 and 3: the same names).
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 3's: four norms a layer, so llama.cpp's ffn_norm is the one before the MLP there.
GEMMA3_LAYER_NAMES = LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
