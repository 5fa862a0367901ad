"""What a GGUF kernel call costs by its row count, on a real file's tensors (issue #51): the rows of a
decode step are one per stream plus one per proposal a verification checks, so speculation and batching
pay what a row costs past the first. For Qwen2.5-Coder-1.5B Q4_K_M's 28 ffn_gate (Q4_K), its 14 Q6_K
ffn_down and its output layer (151,936 Q6_K rows), and for its draft, the 0.5B Q5_0's 24 ffn_gate (Q5_0)
and output layer (Q8_0): milliseconds at 1 to 8 rows, each against one row, beside the generic int8
panels (quantized_matmul) the same tensors widen to, taking turns in one run. The first line is the
machine's read bandwidth, which one row is bound by.

    .venv/bin/python benchmarks/gguf_rows.py [--rows 1,2,3,4,5,8] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from harness import MachineLoad
from real_models import assemble
from rich.console import Console
from rich.table import Table

from llmopt.bench import read_bandwidth_gbs
from llmopt.engine import kernels
from llmopt.engine.formats.gguf import GGUFBlocks
from llmopt.engine.layers import gguf_panels, quantized_panels
from llmopt.gguf_file import read_gguf_file
from results import write_result

# label: (model, the tensors' names in its file)
TENSOR_SETS = {
    "28 ffn_gate (Q4_K)": ("qwen2.5-coder-1.5b", lambda g: [f"blk.{i}.ffn_gate.weight" for i in range(28)]),
    "14 ffn_down (Q6_K)": (
        "qwen2.5-coder-1.5b",
        lambda g: [
            f"blk.{i}.ffn_down.weight"
            for i in range(28)
            if g.tensors[f"blk.{i}.ffn_down.weight"].type.name == "Q6_K"
        ],
    ),
    "output (Q6_K)": ("qwen2.5-coder-1.5b", lambda g: ["output.weight"]),
    "0.5B: 24 ffn_gate (Q5_0)": (
        "qwen2.5-coder-0.5b",
        lambda g: [f"blk.{i}.ffn_gate.weight" for i in range(24)],
    ),
    "0.5B: output (Q8_0)": ("qwen2.5-coder-0.5b", lambda g: ["output.weight"]),
}


def best_ms(call: Callable[[], object], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def generic_matmul(x: torch.Tensor, panels) -> torch.Tensor:
    return torch.ops.llmopt.quantized_matmul(x, panels.packed, panels.scales)


def measure(rows: list[int], repeats: int) -> list[dict]:
    """Per tensor set and row count: the GGUF kernel's and the generic panels' best time."""
    results = []
    files = {model: read_gguf_file(assemble(model)) for model, _ in TENSOR_SETS.values()}
    for label, (model, names) in TENSOR_SETS.items():
        gguf = files[model]
        native, generic = [], []
        for name in names(gguf):
            info = gguf.tensors[name]
            blocks = GGUFBlocks(gguf.read(name), info.type, info.shape[1])
            native.append(gguf_panels.pack(blocks))
            generic.append(quantized_panels.pack(blocks.canonical()))
        # One row prefetches or not as a server on this machine chooses (the first set's one-row calls).
        x1 = torch.randn(1, native[0].in_features)
        gguf_panels.choose_one_row_prefetch(lambda x=x1, native=native: [p.matmul(x) for p in native])
        for m in rows:
            x = torch.randn(m, native[0].in_features)
            gguf_ms = best_ms(lambda x=x, native=native: [p.matmul(x) for p in native], repeats)
            generic_ms = best_ms(
                lambda x=x, generic=generic: [generic_matmul(x, c) for c in generic], repeats
            )
            results.append({"tensors": label, "rows": m, "gguf_ms": gguf_ms, "generic_ms": generic_ms})
    return results


def table(results: list[dict], bandwidth: float, load: MachineLoad) -> Table:
    t = Table(
        title=load.title(
            "GGUF kernel by rows, Qwen2.5-Coder-1.5B Q4_K_M and its 0.5B Q5_0 draft; "
            f"read bandwidth {bandwidth:.1f} GB/s"
        )
    )
    for column in ("tensors", "rows", "GGUF ms", "vs 1 row", "generic int8 ms", "GGUF vs generic"):
        t.add_column(column, justify="left" if column == "tensors" else "right")
    one_row = {r["tensors"]: r["gguf_ms"] for r in results if r["rows"] == 1}
    for r in results:
        base = one_row.get(r["tensors"])
        t.add_row(
            r["tensors"],
            str(r["rows"]),
            f"{r['gguf_ms']:.2f}",
            f"{r['gguf_ms'] / base:.2f}x" if base else "-",
            f"{r['generic_ms']:.2f}",
            f"{r['gguf_ms'] / r['generic_ms']:.2f}x",
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,3,4,5,8")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not kernels.load() or not gguf_panels.supported():
        raise SystemExit("the GGUF kernel needs AVX-512 VNNI and a C++ compiler")
    console = Console(width=140)
    load = MachineLoad.begin(console)
    bandwidth = read_bandwidth_gbs()
    results = measure([int(m) for m in args.rows.split(",")], args.repeats)
    t = table(results, bandwidth, load)
    console.print(t)
    out = {"args": vars(args), "bandwidth_gbs": bandwidth, "results": results}
    console.print(f"wrote {write_result('gguf_rows', {**out, **load.finish(console)}, [t])}")


if __name__ == "__main__":
    main()
