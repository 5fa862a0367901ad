"""Which Python runs a peer: --engine-python, else its environment variable, else its venv in the
current folder, else `python3` on PATH; whichever is chosen must be able to import the peer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.peers import Peer


def find_python(peer: Peer, given: str | None = None, check: bool = True) -> str:
    """The peer's Python; with `check`, one that cannot import the peer is an error saying how to
    install it. Without (--dry-run), the first candidate found is shown as it is. llmopt's own Python is
    the one running."""
    if peer.python:
        return given or peer.python
    named = given or os.environ.get(peer.python_env)
    if named:
        candidates = [named]
    else:
        venv = Path(peer.venv) / "bin" / "python"
        # absolute(), not resolve(): a venv's python is a link, and resolved it is outside the venv
        candidates = [str(venv.absolute())] if venv.exists() else []
        candidates += [p for p in [shutil.which("python3")] if p]
    for python in candidates:
        if not check or imports(python, peer.module):
            return python
    tried = ", ".join(candidates) or "nothing found"
    raise EngineError(
        f"{peer.name} is not installed (no Python that imports {peer.module}; tried {tried}). Install it "
        f"in a venv of its own: {peer.install}; or name its Python with --engine-python or ${peer.python_env}"
    )


def imports(python: str, module: str) -> bool:
    """Whether `python` finds `module`, without importing it (vLLM's import takes seconds)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError:  # no such file, or not executable
        return False
