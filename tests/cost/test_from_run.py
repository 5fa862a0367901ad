"""A bench run's records as a workload: conversations from session and turn, cache writes only where a
later turn reads the cache, failed requests left out, and self-hosting priced at the SLO's throughput."""

from __future__ import annotations

import pytest

from llmopt.bench.schema import PointSummary, RequestRecord
from llmopt.cost.from_run import conversations, mean_shape, served_workloads, slo_point
from llmopt.cost.workload import Workload
from llmopt.pricing import Usage


def rec(prompt, output, cached=None, session=None, turn=None, point="p", success=True) -> RequestRecord:
    line = {
        "index": 0,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "cached_tokens": cached,
        "session": session,
        "turn": turn,
        "point": point,
        "success": success,
    }
    return RequestRecord.from_json(line)


def test_records_become_conversations_in_turn_order():
    records = [
        rec(250, 50, 100, session=0, turn=1),
        rec(100, 50, 0, session=0, turn=0),
        rec(100, 50, None, session=1, turn=0),
        rec(250, 50, None, session=1, turn=1),
        rec(100, 50, session=0, turn=0, point="q"),  # another point's session 0
        rec(80, 20, 60),
        rec(80, 20, 60),
        rec(80, 20, success=False),
    ]
    convs = conversations(records)
    assert [[u.prompt_tokens for u in c] for c in convs] == [[100, 250], [100, 250], [100], [80], [80]]
    # session 0 read the cache on its second turn: each turn's uncached prompt counts as written
    assert convs[0] == [Usage(100, 50, 0, 100), Usage(250, 50, 100, 150)]
    # session 1 never read it: nothing written; lone requests write nothing (a shared prefix is
    # written once, for many)
    assert convs[1] == [Usage(100, 50), Usage(250, 50)]
    assert convs[3] == [Usage(80, 20, 60, 0)]


def test_bad_counts_in_a_record_are_clamped_not_fatal():
    [[usage]] = conversations([rec(-5, None, 99)])
    assert usage == Usage(0, 0, 0, 0)
    [[usage]] = conversations([rec(10, 5, 99)])
    assert usage == Usage(10, 5, 10, 0)


def point(load: int, throughput: float, attainment: float | None, server="s", ok=10) -> PointSummary:
    p = {
        "key": f"{server}|{load}",
        "server": server,
        "load": f"concurrency={load}",
        "concurrency": load,
        "request_rate": None,
        "successful": ok,
        "request_throughput": throughput,
    }
    if attainment is not None:
        p.update(slo={"ttft": 500.0}, slo_attainment=attainment)
    return PointSummary.from_json(p)


def test_self_hosting_is_priced_at_the_busiest_point_within_the_slos():
    points = [point(1, 1.0, 1.0), point(4, 3.0, 0.95), point(16, 5.0, 0.5)]
    best, basis = slo_point(points)
    assert best.concurrency == 4 and "within the SLOs" in basis
    best, basis = slo_point([point(16, 5.0, 0.5)])
    assert best is None and "no point met the SLOs" in basis
    best, basis = slo_point([point(1, 1.0, None), point(4, 3.0, None, ok=0), point(2, 2.0, None)])
    assert best.concurrency == 2 and "no SLO" in basis


def test_served_workloads_split_a_run_by_server_config():
    points = [point(1, 2.0, None, server="a"), point(1, 0.5, None, server="b")]
    records = [rec(10, 5, point="a|1"), rec(10, 5, point="a|1"), rec(20, 5, point="b|1")]
    a, b = served_workloads(records, points)
    assert (a.server, a.workload.requests, a.workload.request_throughput) == ("a", 2, 2.0)
    assert (b.server, b.workload.requests, b.workload.requests_per_minute) == ("b", 1, 30.0)


def test_the_mean_shape_of_a_multi_turn_workload():
    w = Workload([[Usage(100, 50, 0), Usage(250, 50, 100)], [Usage(300, 10), Usage(650, 30, 200)]])
    shape = mean_shape(w)
    assert shape.prompt_tokens == pytest.approx(200) and shape.output_tokens == pytest.approx(35)
    assert shape.turns == 2 and shape.cached_fraction == pytest.approx(300 / 1300)
