"""What a whole decoding step's forward costs by its rows, on a real model (issue #51): a step has one row
per decoding stream plus one per proposal its verification checks, and speculation's policy weighs a
proposal's expected tokens against the row it adds (llmopt/engine/spec_decode/policy.py). Each case runs
the engine's own forward (ModelRunner.run, logits included) on sequences ~40 tokens long (a short
prompt and 24 tokens decoded); the cases take turns, so the VM's drift falls on all alike. Per case: the
median milliseconds, against one row, and milliseconds a token where every proposal is accepted (the best
a verification can do). `gguf_rows.py` splits the same question by kernel.

    .venv/bin/python benchmarks/step_rows.py [--model qwen2.5-coder-1.5b] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from harness import MachineLoad
from real_models import MODELS, model_argument, result_name
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.scheduler import ScheduledBatch
from llmopt.engine.sequence import Sequence
from results import write_result

# (streams, proposals verified for the first stream)
CASES = [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (8, 0), (1, 1), (1, 2), (1, 4), (4, 1), (8, 1)]


def decoding_sequences(engine: LLMEngine, count: int) -> list[Sequence]:
    """`count` sequences past their prefill, each with its next token to compute."""
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)
    for i in range(count):
        engine.add_request(
            engine.tokenizer.encode(f"Tell story number {i} about a lighthouse keeper."), params
        )
    while not all(s.num_computed_tokens == len(s) - 1 for s in engine.scheduler.running):
        engine.step()
    for _ in range(24):
        engine.step()
    return list(engine.scheduler.running)


def batch_for(seqs: list[Sequence], streams: int, proposals: int) -> tuple[ScheduledBatch, list[int]]:
    """A step of `streams` sequences' next tokens, the first verifying `proposals` (token 0s: what they
    are does not change the cost)."""
    for seq in seqs:
        seq.spec_token_ids = []
    seqs[0].spec_token_ids = [0] * proposals
    rows = [1 + proposals] + [1] * (streams - 1)
    return ScheduledBatch(seqs[:streams], rows), rows


def measure(engine: LLMEngine, repeats: int) -> dict[tuple[int, int], float]:
    seqs = decoding_sequences(engine, max(streams for streams, _ in CASES))
    times: dict[tuple[int, int], list[float]] = {case: [] for case in CASES}
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms every shape up, untimed
            for case in CASES:
                batch, logits = batch_for(seqs, *case)
                start = time.perf_counter()
                engine.runner.run(batch, logits)
                times[case].append(time.perf_counter() - start)
    for seq in seqs:
        seq.spec_token_ids = []
    return {case: statistics.median(t[1:]) * 1000 for case, t in times.items()}


def table(ms: dict[tuple[int, int], float], title: str, load: MachineLoad) -> Table:
    t = Table(title=load.title(title))
    t.caption = load.busy
    for column in (
        "streams",
        "proposals verified",
        "rows",
        "ms",
        "against 1 row",
        "ms a token, all accepted",
    ):
        t.add_column(column, justify="right")
    one = ms[(1, 0)]
    for (streams, proposals), value in ms.items():
        tokens = streams + proposals
        t.add_row(
            str(streams),
            str(proposals),
            str(tokens),
            f"{value:.1f}",
            f"{value / one:.2f}x",
            f"{value / tokens:.1f}",
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="of " + ", ".join(MODELS) + ", or a .gguf")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds, the cases taking turns")
    args = ap.parse_args()
    console = Console(width=150)
    load = MachineLoad.begin(console, peer_comparison=False)
    engine = LLMEngine(
        EngineConfig(
            model=model_argument(args.model),
            speculative_config=None,
            enable_prefix_caching=False,
            kv_disk_gb=0,
            max_num_seqs=max(streams for streams, _ in CASES),
        )
    )
    engine.warm_up()
    ms = measure(engine, args.repeats)
    title = (
        f"a decoding step's forward by its rows: {args.model}, median of {args.repeats} rounds taking turns"
    )
    printed = table(ms, title, load)
    console.print(printed)
    rows = [{"streams": s, "proposals": p, "ms": v} for (s, p), v in ms.items()]
    name = result_name("step_rows", args.model)
    console.print(
        f"wrote {write_result(name, {'args': vars(args), 'cases': rows, **load.finish(console)}, [printed])}"
    )


if __name__ == "__main__":
    main()
