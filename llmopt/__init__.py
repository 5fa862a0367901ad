"""llmopt: quantize, serve and benchmark LLMs."""

from __future__ import annotations

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # Imported on first use, so that `llmopt bench` and `--help` start without loading torch.
    if name == "LLM":
        from llmopt.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmopt.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
