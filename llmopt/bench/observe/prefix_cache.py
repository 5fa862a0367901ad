"""Keeping one load point from measuring a prefix cache that another warmed: `POST /reset_prefix_cache`
before each point where the server has it (llmopt serve; vLLM in its dev mode), and a warning for a
point that could still be served from a cache an earlier point or its own warm-up filled."""

from __future__ import annotations

import httpx

from llmopt.bench.auth import bearer_header


def reset_prefix_cache(endpoint: str, api_key: str | None, timeout_s: float = 60) -> bool:
    """Ask the server at `endpoint` (the API base, .../v1) to forget its prefix cache; whether it did
    (False: no such route, an error, or no answer)."""
    try:
        response = httpx.post(
            endpoint.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache",
            json={},
            headers=bearer_header(api_key),
            timeout=timeout_s,
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def cache_warnings(repeating: bool, earlier_points: int, reset: bool, warmup_repeats: bool) -> list[str]:
    """Why a point's numbers may include prefix-cache hits it did not earn. `repeating`: its workload
    sends the same prompts at every point (a file); `earlier_points`: points this server ran before it;
    `reset`: whether the server forgot its cache before the point; `warmup_repeats`: its warm-up sends
    prompts that the point sends again."""
    out = []
    if repeating and earlier_points and not reset:
        out.append(
            "this point sends the prompts of an earlier point and the prefix cache was not reset before it "
            "(the server has no /reset_prefix_cache, or --no-reset-prefix-cache): it may be served from "
            "the cache that point warmed"
        )
    if warmup_repeats:
        out.append(
            "the warm-up sends the file's first prompts, which this point sends again: give --warmup 0 "
            "for TTFT without prefix-cache hits"
        )
    return out
