"""What a server says about itself on its Prometheus /metrics page, read over HTTP (the bench never
imports the server): the speculative-decoding counters of a local llmopt server, before and after a
load point, give the point's acceptance figures."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The llmopt server's counters that a point's "spec" summary is made of, by the summary's names.
SPEC_COUNTERS = {
    "drafts": "llmopt:spec_decode_num_drafts_total",
    "draft_tokens": "llmopt:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llmopt:spec_decode_num_accepted_tokens_total",
}


def parse_metrics(text: str) -> dict[str, float]:
    """A Prometheus text page as {sample name: value}, label sets dropped (the last sample of a name
    wins; an llmopt server serves one model, so its gauges and counters have one sample each).

    Keyed by sample name, not family name: the parser names a counter's family without `_total`,
    while its sample keeps it, as the page shows it (`llmopt:prompt_tokens_total`)."""
    return {
        sample.name: float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(base_url: str, timeout_s: float = 10, client: httpx.Client | None = None) -> dict[str, float]:
    """`base_url`/metrics parsed; empty when the server has no such page or cannot be reached. A caller
    that scrapes often passes its `client`, to keep one connection."""
    try:
        get = client.get if client is not None else httpx.get
        response = get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
        response.raise_for_status()
        return parse_metrics(response.text)
    except (httpx.HTTPError, ValueError):
        return {}


def scrape_spec_counters(endpoint: str) -> dict[str, float]:
    """A local llmopt server's speculative-decoding counters (empty when it has none); `endpoint` is
    the API base URL (.../v1)."""
    values = scrape(endpoint.removesuffix("/v1"))
    return {key: values[metric] for key, metric in SPEC_COUNTERS.items() if metric in values}


def spec_delta(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """The counters' growth over a point with its acceptance rate and mean acceptance length; None
    when the server does not speculate."""
    if not after or not after.get("drafts"):
        return None
    delta: dict = {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}
    delta["acceptance_rate"] = (
        delta["accepted_tokens"] / delta["draft_tokens"] if delta["draft_tokens"] else None
    )
    delta["mean_acceptance_length"] = (
        1 + delta["accepted_tokens"] / delta["drafts"] if delta["drafts"] else None
    )
    return delta
