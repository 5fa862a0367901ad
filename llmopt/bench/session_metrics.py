"""Summary statistics of a multi-turn point, from its records (each carries its session and turn): per
turn index, TTFT and E2E and the share of the prompt the server's prefix cache served
(usage.prompt_tokens_details.cached_tokens over prompt_tokens); per session, the conversation latency
(its first turn sent -> its last answer's last byte, think time included) and how many sessions ran
every turn; and turns per second over the point's wall time."""

from __future__ import annotations

from llmopt.bench.client import RequestRecord
from llmopt.bench.request_metrics import DEFAULT_PERCENTILES, distribution
from llmopt.pricing import TokenSums


def cached_fraction(records: list[RequestRecord]) -> float | None:
    """Cached prompt tokens over prompt tokens, of the records whose server said (None if none did)."""
    told = TokenSums.of(r for r in records if r.cached_tokens is not None)
    return told.cached_tokens / told.prompt_tokens if told.prompt_tokens else None


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
                "ttft_ms": distribution([r.ttft for r in ok], percentiles),
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
