"""Quantization quality cross-checked against llama.cpp (issue #38) on the same GGUF and the same text:
the KL divergence of the bundled model's Q4_1 next-token distribution from its fp32 one, as llmopt
measures it (`llmopt eval --reference`) and as llama.cpp's own runtime gives it on the same file.

The text: the first --positions + 1 tokens of the held-out half of the default corpus, tokenized by
llmopt's tokenizer (llmopt/evaluate/eval_text.py); every position 0..N-1 is compared on its distribution
of the next token. The four distributions per position:

- llmopt Q4_1: our engine in-process on the bundled GGUF, `--dtype auto` (the native Q4_1 kernels);
- llmopt fp32: the same file in float32 with an fp32 output layer (`llmopt eval --reference`'s reference);
- llama.cpp Q4_1 and llama.cpp F32: llama.cpp's server (one slot, so its prompt cache is reused and
  each request decodes one new token) on the bundled file and on its F32 copy (benchmarks/gguf_f32.py,
  every tensor dequantized), one server at a time. The server does not echo prompt log-probabilities:
  each prefix ids[:i+1] is one POST /completion with n_predict 1 and n_probs = the vocabulary, whose
  top_logprobs (post_sampling_probs false) are the softmax of the raw logits at the last position.
  If the server returns fewer entries than the vocabulary, the probability of the tokens it left out
  goes into one "rest" bucket on both sides, and the KLD is a lower bound (the table says so).

Every KLD goes through llmopt.evaluate.kl_divergence, KL(P_ref || P_model) per position, for four pairs
(model vs reference): (a) llmopt Q4_1 vs llmopt fp32, (b) llama.cpp Q4_1 vs llama.cpp F32 (llama.cpp's
own figure on this file and text), (c) llmopt fp32 vs llama.cpp F32 (the two references agree?),
(d) llmopt Q4_1 vs llama.cpp Q4_1; and the ratio of (a)'s mean to (b)'s. The machine's load does not
change the figures (it is recorded, not refused). A run with fewer positions than the default writes
results/kld_llamacpp_quick.json (a smoke run, no figure).

    .venv/bin/python benchmarks/kld_llamacpp.py [--positions 128]
"""

from __future__ import annotations

import argparse
import gc
import math
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
from gguf_f32 import write_f32_copy
from harness import MachineLoad, ServeSubject, peer_installed
from rich.console import Console
from rich.table import Table

from llmopt.bench import LocalServer
from llmopt.checkpoints import bundled_gguf_path, cache_dir, load_tokenizer, resolve_model
from llmopt.evaluate.eval_text import eval_windows, split_tokens
from llmopt.evaluate.kl_divergence import KLAccumulator, KLStats
from llmopt.evaluate.perplexity import engine_scorer
from results import write_result

DEFAULT_POSITIONS = 128
ONE_SLOT = ["--engine", "llama.cpp", "--max-num-seqs", "1"]  # llama.cpp with one slot: its cache is reused
F32_COPY = cache_dir().parent / "gguf" / "SmolLM2-135M-Instruct.F32.gguf"
# key: (row label, model, reference); the KLD is KL(P_reference || P_model).
PAIRS = {
    "a": ("(a) llmopt Q4_1 vs llmopt fp32", "llmopt Q4_1", "llmopt fp32"),
    "b": ("(b) llama.cpp Q4_1 vs llama.cpp F32", "llama.cpp Q4_1", "llama.cpp F32"),
    "c": ("(c) llmopt fp32 vs llama.cpp F32", "llmopt fp32", "llama.cpp F32"),
    "d": ("(d) llmopt Q4_1 vs llama.cpp Q4_1", "llmopt Q4_1", "llama.cpp Q4_1"),
}


@dataclass
class PeerRun:
    """llama.cpp's log-probabilities [positions, vocab] (NaN: a token it did not return), how many
    entries its first answer held, and the prompt tokens it evaluated over all requests."""

    logprobs: torch.Tensor
    returned: int
    prompt_tokens: int


def held_out_ids(positions: int) -> list[int]:
    """positions + 1 tokens of the held-out text: position i predicts token i + 1."""
    tokenizer = load_tokenizer(resolve_model())
    window = eval_windows(split_tokens(tokenizer, None).evaluation, positions + 1, 1)[0].token_ids
    if len(window) < positions + 1:
        raise SystemExit(f"the held-out text has only {len(window)} tokens: ask for fewer --positions")
    return window


def llmopt_logprobs(prompt: list[int], dtype: str) -> torch.Tensor:
    """Our engine's float64 log-probabilities of the next token at every position of `prompt`, on the
    bundled GGUF: dtype "auto" (native Q4_1, the output layer as `auto` makes it) or "float32" (fp32
    output layer too, as `llmopt eval --reference` runs its reference)."""
    gguf = str(bundled_gguf_path())
    score = engine_scorer(resolve_model(gguf), len(prompt), gguf, dtype, dtype)
    with torch.inference_mode():
        logprobs = torch.log_softmax(score(prompt).double(), dim=-1)
    del score
    gc.collect()
    return logprobs


def next_token_logprobs(client: httpx.Client, prefix: list[int], vocab: int) -> tuple[torch.Tensor, int]:
    """llama.cpp's log-probabilities of the token after `prefix` (NaN where it returned none) and the
    prompt tokens it evaluated for this request."""
    body = {
        "prompt": prefix,
        "n_predict": 1,
        "n_probs": vocab,
        "post_sampling_probs": False,
        "cache_prompt": True,
        "temperature": 0,
    }
    response = client.post("/completion", json=body)
    response.raise_for_status()
    data = response.json()
    entries = data["completion_probabilities"][0]["top_logprobs"]
    row = torch.full((vocab,), math.nan, dtype=torch.float64)
    # llama.cpp writes log(0) as the lowest float (or null): a probability that underflowed.
    values = [
        e["logprob"] if e["logprob"] is not None and e["logprob"] > -1e30 else -math.inf for e in entries
    ]
    row[torch.tensor([e["id"] for e in entries])] = torch.tensor(values, dtype=torch.float64)
    return row, int(data["timings"]["prompt_n"])


def llama_cpp_logprobs(label: str, gguf: Path, prompt: list[int], vocab: int, console: Console) -> PeerRun:
    """llama.cpp's next-token log-probabilities at every position of `prompt`, one request a prefix,
    from one server with one slot (its prompt cache holds the previous prefix)."""
    subject = ServeSubject(label, [str(gguf), *ONE_SLOT, "--max-model-len", str(len(prompt) + 64)])
    console.print(f"{label}: llama.cpp on {gguf.name}, {len(prompt)} requests ...")
    rows, evaluated = [], 0
    with (
        LocalServer(subject.command, ready_timeout_s=600) as local,
        httpx.Client(base_url=local.url, timeout=600) as client,
    ):
        for i in range(len(prompt)):
            row, prompt_n = next_token_logprobs(client, prompt[: i + 1], vocab)
            if i == 0:
                check_first_answer(row, prompt_n, vocab, console)
            rows.append(row)
            evaluated += prompt_n
    returned = int((~rows[0].isnan()).sum())
    return PeerRun(torch.stack(rows), returned, evaluated)


def check_first_answer(row: torch.Tensor, prompt_n: int, vocab: int, console: Console) -> None:
    """The one-token prompt must be evaluated as it is (no BOS added); say whether the server capped
    the entries it returns below the vocabulary."""
    if prompt_n != 1:
        raise SystemExit(f"llama.cpp evaluated {prompt_n} tokens for a 1-token prompt: not the same text")
    returned = int((~row.isnan()).sum())
    if returned < vocab:
        console.print(
            f"[yellow]llama.cpp returned {returned} of {vocab} tokens: a rest bucket, KLD a lower bound"
        )
    else:
        console.print(f"  llama.cpp returned all {vocab} tokens' log-probabilities")


def rest_bucket(rows: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """`rows` (log-probabilities, NaN where unknown) over the `known` tokens, -inf elsewhere, and one
    last column: the log of the probability of all other tokens (those of the row, and what the row
    lacks of a total of 1)."""
    present = ~rows.isnan()
    kept = torch.where(known, rows, -math.inf)
    extra = torch.where(present & ~known, rows, -math.inf).logsumexp(-1)
    missing = (1 - torch.where(present, rows, -math.inf).exp().sum(-1)).clamp_min(0).log()
    return torch.cat([kept, torch.logaddexp(extra, missing).unsqueeze(-1)], dim=-1)


def pair_stats(model: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor) -> tuple[KLStats, bool]:
    """KLStats of `model` against `reference` (log-probabilities [positions, vocab]), and whether it is
    a lower bound: where either lacks tokens, both are compared over the tokens both have plus a rest
    bucket (the text's next token, where in it, counts as the bucket)."""
    known = ~(model.isnan() | reference.isnan())
    bounded = not bool(known.all())
    if bounded:
        in_bucket = ~known.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        targets = torch.where(in_bucket, model.shape[-1], targets)
        model, reference = rest_bucket(model, known), rest_bucket(reference, known)
    accumulator = KLAccumulator()
    accumulator.add(model, reference, targets)  # log-probabilities as logits: log_softmax keeps them
    return accumulator.stats(), bounded


def table(stats: dict[str, tuple[KLStats, bool]], ratio: float, load: MachineLoad, positions: int) -> Table:
    title = f"KL(P_ref || P_model) per position, {positions} positions of held-out text, bundled GGUF"
    t = Table(title=load.title(title))
    for column in ("pair (model vs reference)", "mean KLD", "median", "p99", "max", "top-1 agree", "mean Δp"):
        t.add_column(column, justify="left" if column.startswith("pair") else "right")
    for key, (label, _, _) in PAIRS.items():
        s, bounded = stats[key]
        mark = " (lower bound)" if bounded else ""
        t.add_row(
            label + mark,
            f"{s.mean:.6f}",
            f"{s.median:.6f}",
            f"{s.p99:.6f}",
            f"{s.max:.6f}",
            f"{s.top1_agreement:.2%}",
            f"{s.delta_p_mean:+.6f}",
        )
    t.caption = f"(a) mean / (b) mean = {ratio:.3f}: llmopt's Q4_1 KLD against llama.cpp's on the same file"
    if any(bounded for _, bounded in stats.values()):
        t.caption += "\nlower bound: llama.cpp returned fewer tokens than the vocabulary (rest in one bucket)"
    return t


def distributions(prompt: list[int], console: Console) -> tuple[dict[str, torch.Tensor], dict]:
    """The four distributions at every position of `prompt`, and what the llama.cpp runs report."""
    console.print("llmopt in-process: Q4_1 (dtype auto), then fp32 ...")
    rows = {"llmopt Q4_1": llmopt_logprobs(prompt, "auto"), "llmopt fp32": llmopt_logprobs(prompt, "float32")}
    vocab = rows["llmopt fp32"].shape[-1]
    console.print("F32 copy of the GGUF (once) ...")
    files = {
        "llama.cpp Q4_1": bundled_gguf_path(),
        "llama.cpp F32": write_f32_copy(bundled_gguf_path(), F32_COPY),
    }
    peers = {}
    for label, gguf in files.items():
        run = llama_cpp_logprobs(label, gguf, prompt, vocab, console)
        rows[label] = run.logprobs
        peers[label] = {
            "file": str(gguf),
            "returned_entries": run.returned,
            "prompt_tokens_evaluated": run.prompt_tokens,
        }
    return rows, {"vocab": vocab, "llama_cpp": peers}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=DEFAULT_POSITIONS, help="positions compared")
    args = ap.parse_args(argv)
    if args.positions < 2:
        ap.error("--positions must be at least 2")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=150)
    if not peer_installed("llama.cpp"):
        raise SystemExit("llama.cpp's peer is not installed: `make peers`, or $LLMOPT_LLAMA_CPP_PYTHON")
    load = MachineLoad.begin(console)
    ids = held_out_ids(args.positions)
    prompt, targets = ids[:-1], torch.tensor(ids[1:])
    rows, runs = distributions(prompt, console)
    stats = {key: pair_stats(rows[model], rows[ref], targets) for key, (_, model, ref) in PAIRS.items()}
    ratio = stats["a"][0].mean / stats["b"][0].mean if stats["b"][0].mean else math.inf
    kld_table = table(stats, ratio, load, args.positions)
    console.print(kld_table)
    pairs = {
        key: {
            "label": label,
            "model": model,
            "reference": ref,
            "lower_bound": stats[key][1],
            **stats[key][0].to_dict(),
        }
        for key, (label, model, ref) in PAIRS.items()
    }
    # Distributions, not timings: another process on the machine changes none of them.
    out = {"args": vars(args), **runs, "pairs": pairs, "mean_ratio_a_over_b": ratio, "load_matters": False}
    name = "kld_llamacpp" + ("_quick" if args.positions < DEFAULT_POSITIONS else "")
    path = write_result(name, {**out, **load.finish(console)}, [kld_table])
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
