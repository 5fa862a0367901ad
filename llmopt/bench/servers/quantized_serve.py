"""Quantization in the loop: a `[[serve]]` config with `quantize = {method = "gptq", ...}` is served
from a checkpoint that `llmopt quantize` makes when the cache does not hold it yet.

The bench never imports the quantizer (it is the offline, heavy part of llmopt): it runs the
`llmopt quantize` command and reads the `quant_report.json` that the command writes beside the
checkpoint. Checkpoints are cached under `<cache>/<key>/`, the key a hash of the method, its settings
and the source model, so a second run, or a resumed one, quantizes nothing. `llmopt quantize` stages its
checkpoint and renames it into `--out` only when done, report included: a folder without its
quant_report.json is no cached checkpoint (it is made again).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmopt.bench.bench_error import BenchError
from llmopt.bench.servers.server_spec import ServerSpec
from llmopt.checkpoints import QUANT_REPORT_FILE, cache_dir

# `llmopt quantize`'s methods and the settings it takes as flags, with their types (quant/quantize.py's
# QuantizeConfig): repeated here because the bench does not import quant; the command checks the values.
METHODS = ("gptq", "awq", "int8")
SETTINGS: dict[str, type] = {
    "bits": int,
    "group_size": int,
    "calib": str,
    "calib_samples": int,
    "seq_len": int,
    "eval_windows": int,
}
# The command that makes a checkpoint; a test points it at a stand-in.
QUANTIZE_PROGRAM = [sys.executable, "-m", "llmopt.cli", "quantize"]
QUANTIZE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class QuantizeSpec:
    """A `quantize` table: the method and the `llmopt quantize` settings given (the others default)."""

    method: str
    settings: tuple[tuple[str, object], ...] = ()  # (setting, value), sorted: part of the cache key

    def flags(self) -> list[str]:
        flags = ["--method", self.method]
        for name, value in self.settings:
            flags += ["--" + name.replace("_", "-"), str(value)]
        return flags

    def label(self) -> str:
        """'gptq' or 'gptq (bits 4, group_size 64)'."""
        given = ", ".join(f"{name} {value}" for name, value in self.settings)
        return f"{self.method} ({given})" if given else self.method


def parse_quantize(table: object) -> QuantizeSpec:
    """The QuantizeSpec of a `quantize` table; ValueError naming the key that is wrong."""
    if not isinstance(table, dict):
        raise ValueError('quantize must be a table, e.g. quantize = {method = "gptq"}')
    unknown = sorted(set(table) - {"method", *SETTINGS})
    if unknown:
        raise ValueError(
            f"quantize: unknown key(s) {', '.join(unknown)} (known: method, {', '.join(SETTINGS)})"
        )
    method = table.get("method")
    if method not in METHODS:
        raise ValueError(f"quantize: method must be one of {', '.join(METHODS)}, not {method!r}")
    settings = []
    for name, kind in SETTINGS.items():
        if name not in table:
            continue
        value = table[name]
        # TOML gives ints and strings; a bool is an int to Python but no bit count.
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 1):
            wanted = "a positive integer" if kind is int else "a string (a file path)"
            raise ValueError(f"quantize: {name} must be {wanted}, not {value!r}")
        settings.append((name, value))
    return QuantizeSpec(method, tuple(settings))


def source_id(model: str | None) -> str:
    """The source model as the cache key knows it: an existing path made absolute (the same folder
    from another working directory is the same source), any other name as it is."""
    if model is None:
        return "default"
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def cache_key(spec: QuantizeSpec, model: str | None) -> str:
    """A folder name for the checkpoint of `spec` on `model`: the method, then a hash of it all."""
    identity = json.dumps(
        {"method": spec.method, "settings": [list(s) for s in spec.settings], "source": source_id(model)},
        sort_keys=True,
    )
    return f"{spec.method}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def default_cache() -> Path:
    """~/.cache/llmopt/quantized (or $LLMOPT_CACHE/quantized), beside the converted models."""
    return cache_dir().parent / "quantized"


def quantize_command(spec: QuantizeSpec, model: str | None, out: Path) -> list[str]:
    source = [model] if model else []
    return [*QUANTIZE_PROGRAM, *source, "--out", str(out), *spec.flags()]


def is_cached(folder: Path) -> bool:
    """A checkpoint is cached once its report is there: `llmopt quantize` publishes them together."""
    return (folder / QUANT_REPORT_FILE).is_file()


def ensure_checkpoint(spec: QuantizeSpec, model: str | None, root: Path, name: str) -> tuple[Path, bool]:
    """The checkpoint of `spec` on `model` under `root`, made by `llmopt quantize` when missing; and
    whether it was there already. A failure is a BenchError with the command's last lines."""
    folder = root / cache_key(spec, model)
    if is_cached(folder):
        return folder, True
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{folder.name}.log"
    # --overwrite: a folder without its report was left by something else than a finished quantize.
    command = quantize_command(spec, model, folder) + (["--overwrite"] if folder.exists() else [])
    print(f"{name}: quantizing ({spec.label()}) into {folder}; log {log}", file=sys.stderr, flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        try:
            done = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=QUANTIZE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BenchError(f"{name}: `llmopt quantize` did not finish ({exc}); log: {log}") from None
    if done.returncode != 0 or not is_cached(folder):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise BenchError(f"{name}: `{' '.join(command)}` failed (exit {done.returncode}); log: {log}\n{tail}")
    print(f"{name}: quantized in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return folder, False


def read_report(folder: Path) -> dict:
    try:
        report = json.loads((folder / QUANT_REPORT_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchError(f"{folder / QUANT_REPORT_FILE}: cannot be read ({exc})") from None
    if not isinstance(report, dict):
        raise BenchError(f"{folder / QUANT_REPORT_FILE}: not a JSON object")
    return report


def quantized_record(spec: QuantizeSpec, folder: Path, cached: bool) -> dict:
    """What the run keeps of a quantized config: the method and its settings, the checkpoint, and the
    size, perplexity and KL divergence from the source (before and after) that its quant_report.json
    measured (no KL divergence in a report made before llmopt measured it, or with --no-kld)."""
    report = read_report(folder)
    fields = ("bits", "group_size", "calibration_samples", "seconds", "size_before_mb", "size_after_mb")
    return {
        "method": spec.method,
        "settings": dict(spec.settings),
        "checkpoint": str(folder),
        "cached": cached,
        **{f: report.get(f) for f in fields},
        "perplexity_before": report.get("perplexity_before"),
        "perplexity": report.get("perplexity_after"),
        "kl_divergence_before": report.get("kl_divergence_before"),
        "kl_divergence": report.get("kl_divergence_after"),
        "source": report.get("source"),
    }


def baseline_record(quantized: dict) -> dict:
    """An unquantized config on the same source: the source's size, perplexity and KL divergence from
    itself in float32, as measured by the quantize run (same text, same windows), so that both sides of
    the comparison read alike."""
    return {
        "method": "none",
        "settings": {},
        "checkpoint": None,
        "cached": None,
        "size_after_mb": quantized.get("size_before_mb"),
        "size_before_mb": quantized.get("size_before_mb"),
        "perplexity_before": quantized.get("perplexity_before"),
        "perplexity": quantized.get("perplexity_before"),
        "kl_divergence_before": quantized.get("kl_divergence_before"),
        "kl_divergence": quantized.get("kl_divergence_before"),
        "source": quantized.get("source"),
    }


def prepare_servers(servers: list[ServerSpec], root: Path | None) -> tuple[list[ServerSpec], dict]:
    """The configs to serve, each quantized one pointing at its checkpoint (made when missing), and
    {server name: record} for the run's settings: quantized configs, and an unquantized config on the
    same source model as one (its baseline). Empty when no config quantizes."""
    root = root or default_cache()
    served, records = [], {}
    for spec in servers:
        if spec.quantize is None:
            served.append(spec)
            continue
        try:
            quantize = parse_quantize(spec.quantize)
        except ValueError as exc:
            raise BenchError(f"[[serve]] {spec.name}: {exc}") from None
        folder, cached = ensure_checkpoint(quantize, spec.model, root, spec.name)
        records[spec.name] = {**quantized_record(quantize, folder, cached), "model": spec.model}
        served.append(dataclasses.replace(spec, model=str(folder)))
    for spec in servers:
        if spec.quantize is None:
            same = [r for r in records.values() if r["model"] == spec.model and r["method"] != "none"]
            if same:
                records[spec.name] = {**baseline_record(same[0]), "model": spec.model}
    return served, records
