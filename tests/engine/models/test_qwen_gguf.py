"""A real GGUF served from the file itself: Qwen2.5-Coder-0.5B-Instruct (Q5_0, Q8_0, Q6_K and Q4_K tensors,
a 151,936-token vocabulary, q/k/v biases) against llama.cpp on the same file, recorded once by
record_gemma3_llamacpp.py (--model qwen2.5-coder-0.5b-instruct-q5_0.gguf --out qwen05_llamacpp.json) on
seven short prompts and three of 660-1,020 tokens, 32 greedy tokens each.

Held: the tokenizer built from the file's metadata splits every prompt as llama.cpp did; teacher-forced
along llama.cpp's continuations, llmopt's greedy pick is llama.cpp's on >= 97 % of the tokens (99.1 %
measured at --dtype auto, 98.8 % at float32), and where it is not, llama.cpp's token is within a near-tie
(0.10 logit the widest measured) of llmopt's top logit; and a start of `LLM` on the file stays within the
file's size + 1 GB of resident memory (the KV pool's pages are taken only as blocks are written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmopt.checkpoints import cache_dir, load_tokenizer
from llmopt.engine.config import EngineConfig
from llmopt.engine.model_runner import ModelRunner

pytestmark = [pytest.mark.model, pytest.mark.slow]
FIXTURE = Path(__file__).with_name("qwen05_llamacpp.json")
NEAR_TIE = 0.25  # logits: what llama.cpp's quantized compute moves (test_gemma3_gguf.py's bound)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return json.loads(FIXTURE.read_text())["records"]


def test_the_files_tokenizer_splits_every_prompt_as_llamacpp_did(qwen05, records):
    tokenizer = load_tokenizer(qwen05)
    for record in records:
        assert tokenizer(record["prompt"]).input_ids == record["prompt_ids"], record["prompt"][:40]


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_greedy_picks_follow_llamacpps_continuations(qwen05, records, dtype):
    runner = ModelRunner(EngineConfig(str(qwen05), dtype, num_kv_blocks=80), qwen05, max_model_len=1280)
    agree = total = 0
    for record in records:
        logits = runner.prompt_logits(record["prompt_ids"] + record["tokens"])[
            len(record["prompt_ids"]) - 1 : -1
        ]
        theirs = torch.tensor(record["tokens"])
        ours = logits.argmax(-1)
        agree += int((ours == theirs).sum())
        total += len(theirs)
        for i in torch.nonzero(ours != theirs).flatten().tolist():
            assert float(logits[i].max() - logits[i, theirs[i]]) < NEAR_TIE, (record["prompt"][:40], i)
    assert agree / total >= 0.97, agree / total


def test_a_first_start_takes_about_the_files_size_in_memory(qwen05, tmp_path):
    """A first start (nothing saved yet: the file read and laid out, then saved) in a fresh cache, the
    kernels' build of this machine linked in."""
    (tmp_path / "kernels").symlink_to(cache_dir().parent / "kernels")
    # VmHWM, this process's own high-water mark: ru_maxrss would carry the forking pytest's (Linux keeps
    # the larger of the parent's and the child's across fork and exec: 5.0 GB read after the quantize tests).
    code = (
        "from pathlib import Path; from llmopt.engine.llm import LLM; "
        f"llm = LLM({str(qwen05)!r}, kv_cache_memory_gb=1); print(llm.engine.runner.startup_line); "
        "print([int(l.split()[1]) * 1024 for l in Path('/proc/self/status').read_text().splitlines() "
        "if l.startswith('VmHWM')][0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("LLMOPT_")},
            "LLMOPT_CACHE": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1])
    assert peak < qwen05.stat().st_size + 2**30, (peak / 2**30, done.stdout, done.stderr[-3000:])
    assert not (tmp_path / "models").exists()  # no fp32 copy was written
