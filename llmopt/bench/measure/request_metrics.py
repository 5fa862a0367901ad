"""Summary statistics of a load point, with the definitions of `vllm bench serve`:
TTFT = sent -> first content token; ITL = gaps between content chunks; TPOT = (E2E - TTFT) / (output
tokens - 1); E2E = sent -> last byte; throughput = tokens / wall time of the point; goodput = requests/s
meeting every SLO. The sweep computes latencies and throughputs over each point's steady state
(steady_state.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmopt.bench.distribution import DEFAULT_PERCENTILES, distribution
from llmopt.bench.load.structured_answer import OUTCOMES
from llmopt.bench.load.token_count import TOKEN_SOURCES
from llmopt.bench.measure.steady_state import SteadyState, steady_state
from llmopt.bench.schema import RequestRecord
from llmopt.pricing import TokenSums

if TYPE_CHECKING:
    from llmopt.bench.load.load_point import PointResult


def tpot(record: RequestRecord) -> float | None:
    if record.ttft is None or record.e2e is None or record.output_tokens < 2:
        return None
    return (record.e2e - record.ttft) / (record.output_tokens - 1)


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    if not record.success:
        return False
    checks = {
        "ttft": record.ttft,
        "tpot": tpot(record),
        "itl": max(record.itl) if record.itl else 0.0,
        "e2e": record.e2e,
    }
    return all(checks[name] is not None and checks[name] <= limit for name, limit in slo.items())


def token_source(records: list[RequestRecord]) -> str | None:
    """Where a point's token counts are from: the least exact source any of its records used."""
    used = {r.tokens_from for r in records}
    return next((s for s in reversed(TOKEN_SOURCES) if s in used), None)


def structured_counts(records: list[RequestRecord]) -> dict[str, int | None]:
    """How many answers to a response_format were valid, cut by max_tokens or invalid (structured_answer.py);
    None where the point asked for none."""
    asked = [r.structured for r in records if r.structured is not None]
    return {f"structured_{outcome}": asked.count(outcome) if asked else None for outcome in OUTCOMES}


def throughputs(delivered: list[tuple[RequestRecord, float]], span_s: float) -> dict[str, float]:
    """Requests and tokens per second over `span_s` of successful requests, each counted by its share
    (steady_state.py: the part of its output delivered in the span; 1.0 for a whole run)."""
    if span_s <= 0:
        return {"request_throughput": 0.0, "output_throughput": 0.0, "total_token_throughput": 0.0}
    output = sum(share * r.output_tokens for r, share in delivered)
    prompt = sum(share * r.prompt_tokens for r, share in delivered)
    return {
        "request_throughput": sum(share for _, share in delivered) / span_s,
        "output_throughput": output / span_s,
        "total_token_throughput": (output + prompt) / span_s,
    }


def tokens_per_chunk(records: list[RequestRecord]) -> float | None:
    """Output tokens per streamed content chunk: llmopt and vLLM send a decode step's tokens in one chunk,
    so with speculative decoding this is the client's estimate of tokens per decode step (1 + accepted
    proposals per step), 1.0 without it. None where no answer came in more than one chunk (not streamed)."""
    streamed = [r for r in records if r.ttft is not None]
    if not any(r.itl for r in streamed):
        return None
    return sum(r.output_tokens for r in streamed) / sum(1 + len(r.itl) for r in streamed)


def summarize(
    records: list[RequestRecord],
    wall_s: float,
    slo: dict[str, float] | None = None,
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
    steady: SteadyState | None = None,
) -> dict:
    """A point's figures. With `steady` (steady_state.py), latency distributions and throughputs are
    over its steady state and the summary says so; counts, token totals and goodput over every request."""
    ok = [r for r in records if r.success]
    latency, delivered, span = (ok, [(r, 1.0) for r in ok], wall_s)
    if steady is not None:
        latency, delivered, span = steady.latency, steady.delivered, steady.span_s
    tokens = TokenSums.of(ok)
    summary = {
        "requests": len(records),
        "successful": len(ok),
        "failed": len(records) - len(ok),
        # Requests sent again on a fresh connection after the server had closed the pooled one (client.py)
        "reconnects": sum(r.reconnects for r in records),
        **structured_counts(ok),
        "duration_s": wall_s,
        **throughputs(delivered, span),
        "prompt_tokens": tokens.prompt_tokens,
        "output_tokens": tokens.output_tokens,
        "cached_tokens": tokens.cached_tokens,
        "tokens_from": sorted({r.tokens_from for r in ok}),
        "token_source": token_source(ok),
        "ttft_ms": distribution([r.ttft for r in latency], percentiles),
        "tpot_ms": distribution([t for r in latency if (t := tpot(r)) is not None], percentiles),
        "tokens_per_chunk": tokens_per_chunk(ok),
        "itl_ms": distribution([g for r in latency for g in r.itl], percentiles),
        "e2e_ms": distribution([r.e2e for r in latency], percentiles),
        "errors": sorted({r.error for r in records if r.error})[:10],
    }
    if steady is not None:
        summary["steady_state"] = steady.block()
    chained = [r.chained for r in ok if r.chained is not None]
    if chained:  # later turns of Responses API sessions: chained, or replayed where the server refused
        summary["chained_turns"], summary["replayed_turns"] = sum(chained), len(chained) - sum(chained)
    if slo:
        good = sum(meets_slo(r, slo) for r in records)
        summary["slo"] = {k: v * 1000 for k, v in slo.items()}
        summary["goodput"] = good / wall_s if wall_s > 0 else 0.0
        summary["slo_attainment"] = good / len(records) if records else 0.0
    return summary


def summarize_results(
    results: list[PointResult], slo: dict[str, float], percentiles: tuple[float, ...]
) -> dict:
    """The figures of runs of a point: their records pooled; latencies and throughputs over each run's
    steady state (steady_state.py)."""
    records = [r for result in results for r in result.records]
    wall = sum(result.wall_s for result in results)
    steady = steady_state([(result.records, result.wall_s) for result in results])
    return summarize(records, wall, slo, percentiles, steady)
