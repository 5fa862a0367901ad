"""What holding the weights in 2 MB pages is worth on a real model (llmopt/engine/models/huge_pages.py,
issue #51): three engines decode the same prompts greedily, their runs taking turns step by step, each
holding the same loaded model another way:

- `2 MB pages`: the saved model mapped as every start maps it now, its file cached in 2 MB folios;
- `4 KB pages`: a copy of that file cached in 4 KB pages and mapped as it is (what a start found when
  the cache had been filled by small reads, before huge_pages.py read it again);
- `built`: the model as a start builds it in memory from the GGUF (what the first start held before
  it mapped its saved file as well).

Code answers (160 tokens) at 1 and 4 streams, fresh prompts every repeat; the greedy text is checked
equal across the three. Prints tok/s and each pair's ratio against `2 MB pages`, writes
results/huge_pages[-MODEL].json.

    .venv/bin/python benchmarks/huge_pages.py [--model qwen2.5-coder-1.5b] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from harness import CorpusCursor, MachineLoad
from real_models import MODELS, model_argument, result_name
from rich.console import Console
from rich.table import Table
from spec_policy import Arrivals, Prompts, engine_for, requests, run_in_turns

import llmopt.engine.model_runner as model_runner
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.models import huge_pages
from llmopt.engine.models.loaded_model_cache import saved_models_dir
from llmopt.engine.models.loader import load_model
from results import write_result

SUBJECTS = ("2 MB pages", "4 KB pages", "built")
OUTPUT_LEN = 160


@contextmanager
def engine_loading(load) -> Iterator[None]:
    """Engines made inside load their model with `load(checkpoint, dtype, native_gguf, lm_head_dtype)`."""
    saved = model_runner.load_model_cached
    model_runner.load_model_cached = load
    try:
        yield
    finally:
        model_runner.load_model_cached = saved


def in_small_pages(path: Path) -> None:
    """Drop `path` from the page cache and read it back 4 KB at a time, last page first (no read-ahead)."""
    huge_pages.drop_from_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for offset in range(path.stat().st_size // 4096 * 4096, -1, -4096):
            os.pread(fd, 1, offset)
    finally:
        os.close(fd)


def engines_for(model: str, copy_folder: Path) -> dict[str, LLMEngine]:
    engines = {"2 MB pages": engine_for(model, "off", 8)}
    [saved] = saved_models_dir().glob(f"{Path(model).stem}-*/*.pt")  # a model's folder keeps one
    small = copy_folder / saved.name
    shutil.copyfile(saved, small)
    in_small_pages(small)
    with engine_loading(lambda *args: torch.load(small, mmap=True, weights_only=False)):
        engines["4 KB pages"] = engine_for(model, "off", 8)
    with engine_loading(load_model):
        engines["built"] = engine_for(model, "off", 8)
    return engines


def measure(engines: dict[str, LLMEngine], args: argparse.Namespace, console: Console) -> dict:
    prompts = Prompts(engines["2 MB pages"], CorpusCursor(engines["2 MB pages"].tokenizer))
    for engine in engines.values():  # first steps untimed
        run_in_turns([Arrivals(engine, prompts.take("chat", 1), 1, 16)])
    tok_s: dict[int, dict[str, list[float]]] = {}
    for streams in (1, 4):
        tok_s[streams] = {s: [] for s in SUBJECTS}
        for repeat in range(args.repeats):
            batch = prompts.take("code", requests(streams))
            arrivals = {s: Arrivals(engines[s], batch, streams, OUTPUT_LEN) for s in SUBJECTS}
            run_in_turns(list(arrivals.values()))
            runs = {s: a.run() for s, a in arrivals.items()}
            assert len({str(r.outputs) for r in runs.values()}) == 1, "the greedy text differs"
            for s in SUBJECTS:
                tok_s[streams][s].append(runs[s].tok_s)
            console.print(
                f"{streams} streams, repeat {repeat + 1}: "
                + ", ".join(f"{s} {runs[s].tok_s:.1f} tok/s" for s in SUBJECTS)
            )
    return tok_s


def table(tok_s: dict, title: str, load: MachineLoad) -> Table:
    t = Table(title=load.title(title))
    t.caption = load.busy
    for column in ("streams", *(f"{s} tok/s" for s in SUBJECTS), "2 MB / 4 KB pairs", "2 MB / built pairs"):
        t.add_column(column, justify="right")
    for streams, by_subject in tok_s.items():
        huge = by_subject["2 MB pages"]
        t.add_row(
            str(streams),
            *(f"{statistics.mean(by_subject[s]):.1f}" for s in SUBJECTS),
            *(
                ", ".join(f"{a / b:.3f}x" for a, b in zip(huge, by_subject[other]))
                for other in ("4 KB pages", "built")
            ),
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="of " + ", ".join(MODELS) + ", or a .gguf")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each point, on fresh prompts")
    args = ap.parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console, peer_comparison=False)
    with tempfile.TemporaryDirectory(dir=Path.home()) as copy_folder:  # beside the cache: a disk, not tmpfs
        engines = engines_for(model_argument(args.model), Path(copy_folder))
        tok_s = measure(engines, args, console)
    printed = table(tok_s, f"the weights' pages: {args.model}, code at {OUTPUT_LEN} tokens, greedy", load)
    console.print(printed)
    record = {"args": vars(args), "tok_s": {str(k): v for k, v in tok_s.items()}, **load.finish(console)}
    console.print(f"wrote {write_result(result_name('huge_pages', args.model), record, [printed])}")


if __name__ == "__main__":
    main()
