"""Which file or folder a peer is given for llmopt's model argument. vLLM loads Hugging Face folders
(llmopt's fp32 conversion of a GGUF, and compressed-tensors checkpoints from `llmopt quantize`, its own
format) as they are; llama.cpp loads only GGUF files, so an HF folder is refused with the converter."""

from __future__ import annotations

from pathlib import Path

from llmopt.checkpoints import (
    DEFAULT_MODEL,
    GEMMA3_MODEL,
    bundled_gguf_path,
    gemma3_gguf_path,
    reference_folder,
)
from llmopt.engine_servers.engine_error import EngineError

LLAMA_CPP_CONVERTER = (
    "git clone --depth 1 https://github.com/ggml-org/llama.cpp /tmp/llama.cpp && "
    "python /tmp/llama.cpp/convert_hf_to_gguf.py {folder} --outtype f32 --outfile {folder}.gguf"
)


def converted_for_vllm(model: str | None) -> bool:
    """Whether vLLM is handed llmopt's fp32 conversion of a GGUF (the default models, a .gguf path)."""
    return model is None or model in (DEFAULT_MODEL, GEMMA3_MODEL) or model.endswith(".gguf")


def vllm_model(model: str | None) -> str:
    """The default model and a GGUF as llmopt's converted fp32 folder; a folder as it is; anything else
    (a Hugging Face id) goes to vLLM unchanged."""
    if converted_for_vllm(model):
        return str(reference_folder(model))  # vLLM's own GGUF loading is experimental: give it safetensors
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def llama_cpp_model(model: str | None) -> str:
    """The default model as its bundled GGUF, a GGUF as it is; an HF folder is refused."""
    if model is None or model == DEFAULT_MODEL:
        return str(bundled_gguf_path())
    if model == GEMMA3_MODEL:  # the same Q4_K_M file llmopt converts
        return str(gemma3_gguf_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.resolve())
    if path.is_dir():
        raise EngineError(
            f"llama.cpp serves GGUF files, and {model} is a Hugging Face folder: convert it first with "
            + LLAMA_CPP_CONVERTER.format(folder=str(path.resolve()).rstrip("/"))
        )
    raise EngineError(f"model not found: {model} (llama.cpp needs a .gguf file or {DEFAULT_MODEL!r})")
