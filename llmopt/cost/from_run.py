"""A finished bench run as a workload to price: every successful request with its own token counts
(cached tokens as the server reported them), grouped into conversations where the bench's multi-turn
workloads tagged records with a session and a turn; self-hosted serving at the throughput the run
sustained within its SLOs, not at saturation.

Records and points come in as bench/schema.py types them (requests.jsonl's, summary.json's)."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.bench.schema import PointSummary, RequestRecord
from llmopt.cost.conversation_shape import ConversationShape
from llmopt.cost.workload import Workload
from llmopt.pricing import Usage

# A point met the SLOs when this share of its requests met every one of them (the run's goodput over
# its request count); the self-hosted price is that of the busiest such point.
SLO_ATTAINMENT = 0.9


@dataclass
class ServedWorkload:
    """One server config's requests of a run, and the point whose throughput prices self-hosting."""

    server: str
    workload: Workload
    point: PointSummary | None  # None: no point met the SLOs
    basis: str  # how the throughput was chosen, in words


def usage_of(record: RequestRecord, writes: bool) -> Usage:
    """A record's tokens as billed: cached as the server's usage said, whichever API it came through
    (the bench's client reads chat's, the Responses API's and Anthropic's usage fields into the same
    record); written as the server said (Anthropic's cache_creation_input_tokens), else, with `writes`,
    its uncached prompt counts as written to the cache."""
    prompt = max(0.0, float(record.prompt_tokens or 0))
    cached = min(max(0.0, float(record.cached_tokens or 0)), prompt)
    output = max(0.0, float(record.output_tokens or 0))
    told = min(max(0.0, float(record.cache_write_tokens or 0)), prompt - cached)
    return Usage(prompt, output, cached, told if told else prompt - cached if writes else 0.0)


def conversations(records: list[RequestRecord]) -> list[list[Usage]]:
    """The successful records as conversations: those of one session of one point in turn order, any
    other record alone. A conversation whose turns read the provider's cache writes each turn's uncached
    prompt to it (the next turn reads it); a lone request writes nothing (a shared prefix is written
    once and read by many, so its writes do not count)."""
    groups: dict[tuple, list[RequestRecord]] = {}
    for number, record in enumerate(records):
        if not record.success:
            continue
        session = record.session
        key = (record.point, session) if session is not None else ("alone", number)
        groups.setdefault(key, []).append(record)
    out = []
    for turns in groups.values():
        turns.sort(key=lambda r: r.turn or 0)
        writes = len(turns) > 1 and any((r.cached_tokens or 0) > 0 for r in turns)
        out.append([usage_of(r, writes) for r in turns])
    return out


def mean_shape(workload: Workload) -> ConversationShape:
    """The conversation shape a workload averages to: the first turns' prompts as the new tokens per
    turn, the mean answer, the mean number of turns and the share of prompt tokens that were cached."""
    assert workload.requests, "an empty workload has no shape"
    firsts = [c[0] for c in workload.conversations]
    totals = workload.token_totals()
    cached = totals.cached_tokens / totals.prompt_tokens if totals.prompt_tokens else 0.0
    return ConversationShape(
        sum(u.prompt_tokens for u in firsts) / len(firsts),
        totals.output_tokens / workload.requests,
        max(1, round(workload.requests / len(workload.conversations))),
        min(1.0, cached),
    )


def slo_point(points: list[PointSummary]) -> tuple[PointSummary | None, str]:
    """The busiest point (by requests/s) within the SLOs, or the busiest of all when no SLO was set;
    with how it was chosen."""
    ok = [p for p in points if p.successful]
    with_slo = [p for p in ok if p.slo]
    if not with_slo:
        best = max(ok, key=lambda p: p.request_throughput, default=None)
        return best, "the busiest point (the run set no SLO)"
    met = [p for p in with_slo if (p.slo_attainment or 0) >= SLO_ATTAINMENT]
    best = max(met, key=lambda p: p.request_throughput, default=None)
    if best is None:
        return None, f"no point met the SLOs for {SLO_ATTAINMENT:.0%} of its requests"
    return best, f"the busiest point with {SLO_ATTAINMENT:.0%} of requests within the SLOs"


def served_workloads(records: list[RequestRecord], points: list[PointSummary]) -> list[ServedWorkload]:
    """One workload per server config of the run, in the order its points ran."""
    server_of = {p.key: p.server for p in points}
    servers = list(dict.fromkeys(p.server for p in points))
    out = []
    for server in servers:
        mine = [r for r in records if server_of.get(r.point) == server]
        point, basis = slo_point([p for p in points if p.server == server])
        throughput = point.request_throughput if point else None
        per_minute = throughput * 60 if throughput else None
        workload = Workload(conversations(mine), throughput, per_minute)
        out.append(ServedWorkload(server, workload, point, basis))
    return out
