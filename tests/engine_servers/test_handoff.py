"""Which checkpoint each engine is given: vLLM takes Hugging Face folders (llmopt's fp32 conversion of
the default model among them) as they are, llama.cpp GGUF files, and an HF folder is refused for it with
the converter command."""

from __future__ import annotations

import pytest

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.handoff import llama_cpp_model, vllm_model


def test_llama_cpp_gets_the_bundled_gguf_for_the_default_model_and_a_gguf_as_it_is(tmp_path):
    assert llama_cpp_model(None) == llama_cpp_model("smollm2-135m") == str(bundled_gguf_path())
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert llama_cpp_model(str(gguf)) == str(gguf)


def test_llama_cpp_refuses_a_hugging_face_folder_with_the_converter_command(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineError) as error:
        llama_cpp_model(str(tmp_path))
    assert "convert_hf_to_gguf.py" in str(error.value) and str(tmp_path) in str(error.value)
    with pytest.raises(EngineError, match="model not found"):
        llama_cpp_model(str(tmp_path / "absent.gguf"))


def test_vllm_gets_a_folder_as_it_is_and_a_hub_id_unchanged(tmp_path):
    assert vllm_model(str(tmp_path)) == str(tmp_path.resolve())
    assert vllm_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_vllm_gets_llmopts_fp32_folder_for_the_default_model(model_dir):
    assert vllm_model(None) == vllm_model("smollm2-135m") == str(model_dir)
    assert (model_dir / "config.json").is_file()
