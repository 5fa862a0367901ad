"""Record llama.cpp's greedy continuations of a real GGUF (the Gemma 3 270M by default) into its fixture
(gemma3_llamacpp.json), and its log-probabilities of a fixed text into gemma3_llamacpp_logprobs.json:
the references test_gemma3_gguf.py and test_qwen_gguf.py compare llmopt with (so CI needs no llama.cpp).
Run once, by hand:

    .peer-venv/bin/python llmopt/engine_servers/llama_cpp_server.py --np 1 --port 8166 \\
        --model ~/.cache/llmopt/gguf/gemma-3-270m-q4_k_m.gguf &
    .venv/bin/python tests/engine/models/record_gemma3_llamacpp.py --url http://127.0.0.1:8166 \\
        [--part greedy|logprobs] [--model FILE_NAME --out FIXTURE.json]

Greedy: ten mixed prompts; three are longer than the model's 512-token sliding window. Log-probabilities:
llama.cpp's server scores no prompt tokens, so each token of the text is scored teacher-forced by its own
request over the text before it (n_predict 1, the prefix cached from the previous request): the logit
bias forces the sampled token to be the text's next one, and with n_probs the server reports that
token's probability from the raw logits (the bias is a sampler step, after them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import httpx

from llmopt.corpus import default_text

FIXTURE = Path(__file__).with_name("gemma3_llamacpp.json")
LOGPROBS_FIXTURE = Path(__file__).with_name("gemma3_llamacpp_logprobs.json")
MAX_TOKENS = 32
SCORED_TEXT = (200_000, 2700)  # start and length in default_text(): 600+ tokens, past the 512 window
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


def next_token_logprob(client: httpx.Client, prefix: list[int], token: int) -> float:
    body = {
        "prompt": prefix,
        "n_predict": 1,
        "temperature": 0,
        "n_probs": 1,
        "logit_bias": [[token, 1000.0]],
        "cache_prompt": True,
        "return_tokens": True,
    }
    out = client.post("/completion", json=body).json()
    [scored] = out["completion_probabilities"]
    assert out["tokens"] == [token] == [scored["id"]], (out["tokens"], token)
    return float(scored["logprob"])


def record_logprobs(url: str) -> dict:
    start, size = SCORED_TEXT
    text = default_text()[start : start + size]
    with httpx.Client(base_url=url, timeout=600) as client:
        ids = client.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
        logprobs = [next_token_logprob(client, ids[:i], ids[i]) for i in range(1, len(ids))]
    perplexity = math.exp(-sum(logprobs) / len(logprobs))
    print(len(ids), "tokens, llama.cpp perplexity", round(perplexity, 4))
    return {"text": text, "token_ids": ids, "logprobs": logprobs, "perplexity": perplexity}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8166")
    ap.add_argument("--part", choices=("greedy", "logprobs", "both"), default="both")
    ap.add_argument("--model", default="gemma-3-270m-q4_k_m.gguf", help="the served file's name, recorded")
    ap.add_argument("--out", type=Path, default=FIXTURE, help="the greedy fixture to write")
    args = ap.parse_args()
    model = {"model": args.model}
    if args.part in ("greedy", "both"):
        args.out.write_text(json.dumps({**model, "records": record(args.url)}, indent=1) + "\n")
    if args.part in ("logprobs", "both"):
        LOGPROBS_FIXTURE.write_text(json.dumps({**model, **record_logprobs(args.url)}) + "\n")


if __name__ == "__main__":
    main()
