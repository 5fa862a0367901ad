"""A loaded model's weights laid out for the compiled kernels (the runner asks once it knows they run):
dense fp32 linears in panels, and, where every linear has a kernel, the flat list a one-call decode step
(decode_layers, decode_gemma3_layers in kernels/cpu_kernels.cpp) reads, in the order it reads it."""

from __future__ import annotations

import torch

from llmopt.engine.layers.linear import one_call_linears, pack_dense_linears
from llmopt.engine.models.gemma3 import Gemma3ForCausalLM
from llmopt.engine.models.llama import LlamaForCausalLM


def pack_for_kernels(model: LlamaForCausalLM | Gemma3ForCausalLM) -> None:
    """Re-lay `model`'s linears and set its decode_weights / decode_max_rows where one call can run."""
    if isinstance(model, Gemma3ForCausalLM):
        pack_dense_linears((model, *model.layers))
        set_gemma3_decode_weights(model)
        return
    pack_dense_linears(model.modules())  # the layers' linears, and the experts' of MoE layers
    if model.fused_decode and all(layer.q_norm is None for layer in model.layers):
        set_llama_decode_weights(model)


def layer_linears(layer: torch.nn.Module) -> tuple:
    return layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight


def set_llama_decode_weights(model: LlamaForCausalLM) -> None:
    compiled = one_call_linears([layer_linears(layer) for layer in model.layers])
    if compiled is None:
        return  # a layer without a compiled kernel: layer by layer
    linears, model.decode_max_rows = compiled
    no_bias = torch.empty(0)
    model.decode_weights = [  # the order decode_layers reads them in, eleven a layer
        t
        for layer, (qkv, o, gate_up, down) in zip(model.layers, linears)
        for t in (
            layer.input_norm,
            *qkv,
            no_bias if layer.qkv_bias is None else layer.qkv_bias,
            *o,
            layer.post_attention_norm,
            *gate_up,
            *down,
        )
    ]


def set_gemma3_decode_weights(model: Gemma3ForCausalLM) -> None:
    compiled = one_call_linears([layer_linears(layer) for layer in model.layers])
    if compiled is None:
        return  # a layer without a compiled kernel: layer by layer
    linears, model.decode_max_rows = compiled
    model.decode_weights = [  # the order decode_gemma3_layers reads them in, fourteen a layer
        t
        for layer, (qkv, o, gate_up, down) in zip(model.layers, linears)
        for t in (
            layer.input_norm,
            *qkv,
            layer.q_norm,
            layer.k_norm,
            *o,
            layer.post_attention_norm,
            layer.pre_feedforward_norm,
            *gate_up,
            *down,
            layer.post_feedforward_norm,
        )
    ]
