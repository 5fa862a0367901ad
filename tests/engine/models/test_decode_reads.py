"""The bytes a decode step reads of the weights (models/decode_reads.py), which /metrics publishes and the
bench divides by the ITL: in fp32 exactly the model's parameters less the embedding's, plus the output
layer (the default model ties it to the embedding, so the sum is every parameter once); quantized, the
kernels' packed copies."""

from __future__ import annotations

import pytest

from llmopt.engine.layers import gguf_panels
from llmopt.engine.llm import LLM

pytestmark = pytest.mark.model


def test_fp32_reads_every_parameter_once_as_the_reference_counts_them(model_dir, hf_model):
    assert hf_model.config.tie_word_embeddings  # the output layer is the embedding, read whole per step
    parameters = sum(p.numel() for p in hf_model.parameters())  # the tied matrix counted once
    runner = LLM(str(model_dir), dtype="float32", num_kv_blocks=16).engine.runner
    assert runner.decode_weight_bytes == 4 * parameters


def test_the_4bit_default_reads_the_packed_blocks(hf_model):
    parameters = sum(p.numel() for p in hf_model.parameters())
    runner = LLM(num_kv_blocks=16).engine.runner  # the bundled GGUF at --dtype auto: its Q4_1 blocks
    embedding = hf_model.get_input_embeddings().weight.numel()
    if gguf_panels.supported():
        # the file's own blocks: Q4_1 layers (20 bytes a block of 32: 5 bits a weight) and the tied Q8_0
        # embedding as the output layer (34 bytes a block: 8.5 bits), norms aside.
        expected = (parameters - embedding) * 5 / 8 + embedding * 8.5 / 8
    else:
        # 4-bit layers with an fp32 scale and offset per 32 weights (6 bits a weight), an int8 output
        # layer with them per 32 too (10 bits a weight), norms aside.
        expected = (parameters - embedding) * 6 / 8 + embedding * 10 / 8
    assert 0.95 * expected < runner.decode_weight_bytes < 1.05 * expected
