"""Where an engine step's time goes at concurrency 16: the default model, fresh prompts (128 tokens in, 64
out, all submitted at once), timed with perf_counter around the engine's own calls. Each step is either a
decode step (every sequence computes one new token: the one-call decode path) or a prefill step (at least
one prompt chunk; decodes may ride along). For each kind: the count, the mean step and how it splits into
scheduling, building the batch tensors, the layers' forward, the output layer, and the rest (sampling,
stop checks, detokenizing, Python). Prints a table and writes results/profile_step.json.

    .venv/bin/python benchmarks/profile_step.py [--requests 64] [--concurrency 16] [--prompt-len 128]
        [--output-len 64] [--model FILE.gguf]

--python-layers runs decode steps through the per-layer Python path instead of the one compiled call
(decode_layers), to measure what that call saves.

CPU ops run synchronously, so the time around a call is that call's time; the wrappers cost well under a
microsecond a call. Prefix caching stays on (the default) and finds nothing: the prompts are text no
other prompt of the run contains (the run's cached prompt tokens are printed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from harness import CorpusCursor, MachineLoad
from real_models import result_name
from rich.console import Console
from rich.table import Table

from llmopt import SamplingParams
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from results import write_result

PARTS = ("schedule", "batch tensors", "layers", "output layer")


class StepTimer:
    """Seconds spent in each instrumented call during the current step, and the batch it scheduled."""

    def __init__(self) -> None:
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.batch = None

    def reset(self) -> None:
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.batch = None

    def wrap(self, owner: object, attribute: str, part: str) -> None:
        """Replace owner.attribute by a version that adds its time to `part` (an instance attribute:
        the engine's calls through `self.` reach it, and nothing else is affected)."""
        original: Callable = getattr(owner, attribute)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                self.parts[part] += time.perf_counter() - start
            if part == "schedule":
                self.batch = result
            return result

        setattr(owner, attribute, timed)


def instrument(engine: LLMEngine) -> StepTimer:
    timer = StepTimer()
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.runner, "prepare", "batch tensors")
    timer.wrap(engine.runner.model, "forward", "layers")  # nn.Module.__call__ calls self.forward
    timer.wrap(engine.runner.model, "logits", "output layer")
    return timer


def profile(
    engine: LLMEngine, timer: StepTimer, prompts: list[list[int]], output_len: int
) -> tuple[list, dict]:
    """Run every prompt to the end; one record per step that ran the model."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    steps, cached, tokens = [], 0, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        timer.reset()
        step_start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - step_start
        for out in outputs:
            tokens += len(out.new_token_ids)
            cached += out.cached_tokens if out.finished else 0
        batch = timer.batch
        if batch is None or not batch.seqs:
            continue
        new_tokens = batch.num_new_tokens
        steps.append(
            {
                "kind": "decode" if all(n == 1 for n in new_tokens) else "prefill",
                "seqs": len(new_tokens),
                "tokens": sum(new_tokens),
                "step_s": seconds,
                **{part: timer.parts[part] for part in PARTS},
                "rest": seconds - sum(timer.parts.values()),
            }
        )
    wall = time.perf_counter() - start
    return steps, {
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall,
        "cached_tokens": cached,
    }


def summarize_steps(steps: list[dict]) -> dict[str, dict]:
    total = sum(s["step_s"] for s in steps)
    kinds = {}
    for kind in ("decode", "prefill"):
        mine = [s for s in steps if s["kind"] == kind]
        if not mine:
            continue
        time_s = sum(s["step_s"] for s in mine)
        kinds[kind] = {
            "steps": len(mine),
            "mean_seqs": statistics.mean(s["seqs"] for s in mine),
            "mean_tokens": statistics.mean(s["tokens"] for s in mine),
            "mean_step_ms": 1000 * time_s / len(mine),
            "median_step_ms": 1000 * statistics.median(s["step_s"] for s in mine),
            **{f"mean_{p}_ms": 1000 * statistics.mean(s[p] for s in mine) for p in (*PARTS, "rest")},
            "model_forward_share": sum(s["layers"] + s["output layer"] for s in mine) / time_s,
            "share_of_step_time": time_s / total,
        }
    return kinds


def print_report(
    kinds: dict, run: dict, args: argparse.Namespace, path: str, load: MachineLoad, console: Console
) -> Table:
    title = (
        f"engine steps at concurrency {args.concurrency}: {args.requests} requests, "
        f"prompt {args.prompt_len}, output {args.output_len} tokens (mean ms per step); decode steps: {path}"
    )
    table = Table(title=load.title(title))
    columns = ("kind", "steps", "seqs", "tokens", "step", "median", *PARTS, "rest", "model forward", "of run")
    for col in columns:
        table.add_column(col, justify="right")
    for kind, k in kinds.items():
        table.add_row(
            kind,
            str(k["steps"]),
            f"{k['mean_seqs']:.1f}",
            f"{k['mean_tokens']:.0f}",
            f"{k['mean_step_ms']:.1f}",
            f"{k['median_step_ms']:.1f}",
            *(f"{k[f'mean_{p}_ms']:.2f}" for p in (*PARTS, "rest")),
            f"{100 * k['model_forward_share']:.0f}%",
            f"{100 * k['share_of_step_time']:.0f}%",
        )
    console.print(table)
    console.print(
        "model forward = layers + output layer; rest = everything else in the step (sampling, stop checks, "
        "detokenizing, bookkeeping). "
        f"Run: {run['output_tok_s']:.1f} output tok/s over {run['wall_s']:.1f} s; "
        f"{run['cached_tokens']} prompt tokens came from the prefix cache"
    )
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16, help="the engine's max_num_seqs")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--python-layers", action="store_true", help="decode through the per-layer path")
    ap.add_argument("--model", default=None, help="a .gguf or folder (default: the bundled model)")
    args = ap.parse_args()
    if min(args.requests, args.concurrency, args.prompt_len, args.output_len) < 1:
        ap.error("every count must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    load = MachineLoad.begin(console)
    engine = LLMEngine(EngineConfig(args.model, max_num_seqs=args.concurrency))
    if args.python_layers:  # what the kernel tests do to compare the two paths: same kernels, op by op
        engine.runner.model.decode_weights = None
    path = "per-layer Python path" if args.python_layers else "one compiled call (decode_layers)"
    if engine.runner.model.decode_weights is None and not args.python_layers:
        path = "per-layer path (this model or machine has no one-call decode step)"
    console.print(f"decode steps: {path}")
    cursor = CorpusCursor(engine.tokenizer)
    timer = instrument(engine)
    profile(engine, timer, cursor.prompts(2, args.prompt_len), 8)  # warm-up on text of its own
    steps, run = profile(engine, timer, cursor.prompts(args.requests, args.prompt_len), args.output_len)
    kinds = summarize_steps(steps)
    table = print_report(kinds, run, args, path, load, console)
    out = {"args": vars(args), "decode_path": path, "run": run, "kinds": kinds, "steps": steps}
    write_result(result_name("profile_step", args.model), {**out, **load.finish(console)}, [table])


if __name__ == "__main__":
    main()
