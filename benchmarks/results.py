"""Where every benchmark writes its JSON: results/ at the top of the checkout, with where it came from
(the command, the commit, the date, the CPU and its vector flags, the cores), so that a figure names the
machine it was measured on."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")


def cpu() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("flags\t\t", fields.get("flags", "")).split())
    model = next((v.strip() for k, v in fields.items() if k.strip() == "model name"), platform.processor())
    return {"model": model, "vector_flags": [f for f in VECTOR_FLAGS if f in flags], "cores": os.cpu_count()}


def provenance() -> dict:
    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], capture_output=True, text=True, cwd=RESULTS.parent)
        return run.stdout.strip()

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git("rev-parse", "--short", "HEAD")
        + (" (with uncommitted changes)" if git("status", "--porcelain", "-uno") else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu(),
    }


def write_result(name: str, data: dict) -> Path:
    """Write `data` with its provenance as results/<name>.json and return the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"provenance": provenance(), **data}, indent=2, default=str))
    return path
