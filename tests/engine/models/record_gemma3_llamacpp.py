"""Record llama.cpp's greedy continuations of the real Gemma 3 270M GGUF into gemma3_llamacpp.json, the
reference test_gemma3_gguf.py compares llmopt with (so CI needs no llama.cpp). Run once, by hand:

    .peer-venv/bin/python llmopt/engines/llama_cpp_server.py --np 1 --port 8166 \\
        --model ~/.cache/llmopt/gguf/gemma-3-270m-q4_k_m.gguf &
    .venv/bin/python tests/engine/models/record_gemma3_llamacpp.py --url http://127.0.0.1:8166

Ten mixed prompts; three are longer than the model's 512-token sliding window.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from llmopt.corpus import default_text

FIXTURE = Path(__file__).with_name("gemma3_llamacpp.json")
MAX_TOKENS = 32
SHORT = [
    "The old clockmaker opened his shop and",
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "Here is a list of five fruits:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Water boils at 100 degrees Celsius because",
    "import numpy as np\n\n# Compute the mean of each column\n",
]


def long_prompts() -> list[str]:
    """Passages of real English from the stdlib's pydoc text, ~700-1100 tokens each."""
    text = default_text()
    return [text[start : start + size] for start, size in ((20_000, 3000), (60_000, 4000), (120_000, 4500))]


def record(url: str) -> list[dict]:
    records = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for prompt in SHORT + long_prompts():
            ids = client.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
            body = {
                "prompt": ids,
                "n_predict": MAX_TOKENS,
                "temperature": 0,
                "top_k": 1,
                "cache_prompt": False,
                "return_tokens": True,
            }
            out = client.post("/completion", json=body).json()
            records.append(
                {"prompt": prompt, "prompt_ids": ids, "tokens": out["tokens"], "text": out["content"]}
            )
            print(len(ids), repr(out["content"][:60]))
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8166")
    records = record(ap.parse_args().url)
    FIXTURE.write_text(json.dumps({"model": "gemma-3-270m-q4_k_m.gguf", "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
