"""`llmopt serve` stopped and started again keeps its sessions' prefixes: a stop writes the pool's cached
blocks to the KV disk tier, and the next process (where Python's hash of the RAM cache's keys is salted
afresh, the tier's content digests are not) loads them instead of computing them. usage's
prompt_tokens_details says how many cached tokens came from disk, /metrics counts them, and the answer
is the one a RAM hit gave before the restart."""

from __future__ import annotations

import httpx

from tests.conftest import PROMPTS, LiveServer

ARGS = ("--num-kv-blocks", "64")
PROMPT = "Read these notes, then answer.\n" + "\n".join(PROMPTS) + "\nWhich note is about France?"


def complete(server: LiveServer) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def details(answer: dict) -> tuple[int, int]:
    d = answer["usage"]["prompt_tokens_details"]
    return d["cached_tokens"], d["disk_cached_tokens"]


def test_a_restarted_server_loads_its_predecessors_blocks_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_KV_DIR", str(tmp_path))  # the servers' own tier, shared by both
    with LiveServer(*ARGS) as first:
        cold = complete(first)
        warm = complete(first)  # its prefix from the RAM tier
    full_blocks = (cold["usage"]["prompt_tokens"] - 1) // 16 * 16
    assert details(cold) == (0, 0) and details(warm) == (full_blocks, 0)
    with LiveServer(*ARGS) as second:
        restarted = complete(second)
        metrics = second.metrics()
    assert details(restarted) == (full_blocks, full_blocks)  # every block, from disk
    assert restarted["choices"][0]["text"] == warm["choices"][0]["text"]
    assert metrics["llmopt:prefix_cache_disk_hits_total"] == full_blocks
    assert metrics["llmopt:kv_disk_blocks_read_total"] == full_blocks // 16
