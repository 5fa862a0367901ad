"""Summary statistics of a multi-turn point, from its records (each carries its session and turn): per
turn index, TTFT and E2E and the share of the prompt the server's prefix cache served
(usage.prompt_tokens_details.cached_tokens over prompt_tokens), and TTFT split by where most of each
turn's prompt came from: the server's prefix cache in RAM, its disk tier (llmopt serve's
prompt_tokens_details.disk_cached_tokens), or computed again; per session, the conversation latency
(its first turn sent -> its last answer's last byte, think time included) and how many sessions ran
every turn; and turns per second over the point's wall time."""

from __future__ import annotations

from llmopt.bench.distribution import DEFAULT_PERCENTILES, distribution
from llmopt.bench.schema import RequestRecord
from llmopt.pricing import TokenSums


def cached_fraction(records: list[RequestRecord]) -> float | None:
    """Cached prompt tokens over prompt tokens, of the records whose server said (None if none did)."""
    told = TokenSums.of(r for r in records if r.cached_tokens is not None)
    return told.cached_tokens / told.prompt_tokens if told.prompt_tokens else None


PREFIX_SOURCES = ("ram", "disk", "computed")


def prefix_source(record: RequestRecord) -> str | None:
    """Where most of a turn's prompt came from: "ram" (the prefix cache's blocks in memory), "disk" (a
    disk tier's) or "computed" (prefilled); None where the server did not say what it cached."""
    if record.cached_tokens is None:
        return None
    disk = record.disk_cached_tokens or 0
    shares = {
        "ram": record.cached_tokens - disk,
        "disk": disk,
        "computed": record.prompt_tokens - record.cached_tokens,
    }
    return max(PREFIX_SOURCES, key=lambda source: shares[source])  # a tie goes to the first


def by_prefix_source(records: list[RequestRecord], percentiles: tuple[float, ...]) -> dict[str, dict]:
    """{source: {"turns": n, "ttft_ms": distribution}} of the sources some turn came from."""
    split: dict[str, list[RequestRecord]] = {}
    for r in records:
        if (source := prefix_source(r)) is not None:
            split.setdefault(source, []).append(r)
    return {
        source: {
            "turns": len(split[source]),
            "ttft_ms": distribution([r.ttft for r in split[source]], percentiles),
        }
        for source in PREFIX_SOURCES
        if source in split
    }


def disk_fraction(records: list[RequestRecord]) -> float | None:
    """Prompt tokens loaded from the server's disk tier over prompt tokens (None where no server said)."""
    told = [r for r in records if r.disk_cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in told)
    return sum(r.disk_cached_tokens for r in told) / prompt if told and prompt else None


def per_turn(records: list[RequestRecord], percentiles: tuple[float, ...]) -> list[dict]:
    out = []
    for k in sorted({r.turn for r in records if r.turn is not None}):
        sent = [r for r in records if r.turn == k]
        ok = [r for r in sent if r.success]
        out.append(
            {
                "turn": k,
                "requests": len(sent),
                "successful": len(ok),
                "prompt_tokens_mean": sum(r.prompt_tokens for r in ok) / len(ok) if ok else None,
                "cached_fraction": cached_fraction(ok),
                "disk_cached_fraction": disk_fraction(ok),
                "ttft_ms": distribution([r.ttft for r in ok], percentiles),
                "ttft_by_prefix": by_prefix_source(ok, percentiles),
                "e2e_ms": distribution([r.e2e for r in ok], percentiles),
            }
        )
    return out


def summarize_sessions(
    records: list[RequestRecord],
    wall_s: float,
    planned_turns: dict[int, int],
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
) -> dict:
    """{"conversations": {...}, "turns": [...]} of a point; `planned_turns` gives each started session's
    number of turns (a session is complete when every one of them succeeded)."""
    by_session: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.session is not None:
            by_session.setdefault(r.session, []).append(r)
    complete = {
        s: rs
        for s, rs in by_session.items()
        if len(rs) == planned_turns.get(s) and all(r.success for r in rs)
    }
    latencies = [max(r.start + r.e2e for r in rs) - min(r.start for r in rs) for rs in complete.values()]
    ok_turns = sum(r.success for r in records if r.session is not None)
    sessions = {
        "started": len(by_session),
        "completed": len(complete),
        "failed": sum(any(not r.success for r in rs) for rs in by_session.values()),
        "turns_per_s": ok_turns / wall_s if wall_s > 0 else 0.0,
        "conversation_ms": distribution(latencies, percentiles),
    }
    return {"conversations": sessions, "turns": per_turn(records, percentiles)}
