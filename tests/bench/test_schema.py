"""The run folder's types (bench/schema.py): the committed run folder (data/recorded_run/, written by the
bench before the types existed) loads into them with the figures it holds, and each type gives back the
JSON it was read from, key for key and in order; a key an older run lacks reads as its default, one a
later bench wrote is kept."""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import (
    ClientBlock,
    PointSummary,
    RequestRecord,
    RunSettings,
    SteadyStateBlock,
)

RECORDED = Path(__file__).parent / "data" / "recorded_run"


def recorded_json() -> dict:
    return json.loads((RECORDED / "summary.json").read_text())


def test_the_recorded_run_loads_into_the_types_with_its_figures():
    summary = RunDir(RECORDED).read_summary()
    settings = summary.settings
    assert isinstance(settings, RunSettings) and settings.started == "2026-12-06T11:11:01"
    assert (settings.slo, settings.percentiles, settings.api) == (
        "ttft=5s",
        (50.0, 90.0, 99.0),
        "completions",
    )
    assert (settings.machine.cores, settings.machine.host) == (2, "vm") and settings.search is None
    closed, opened = summary.points
    assert all(isinstance(p, PointSummary) for p in summary.points)
    assert closed.key == "endpoint|prompt=8|output=3|concurrency=2"
    assert (closed.concurrency, closed.load) == (2, "concurrency=2")
    assert (closed.requests, closed.successful, closed.prompt_tokens, closed.output_tokens) == (4, 4, 40, 12)
    assert closed.ttft_ms["p99"] == 1.5853736298231524 and closed.request_throughput == 701.0996571416628
    assert closed.steady_state == SteadyStateBlock(
        closed.steady_state.rule, False, 4, 4, 4.0, 0.005705323001166107
    )
    assert closed.slo == {"ttft": 5000.0} and closed.slo_attainment == 1.0 and closed.conversations is None
    assert isinstance(closed.client, ClientBlock) and closed.client.loop_lag_ms["p99"] is None
    assert (opened.request_rate, opened.concurrency, opened.goodput) == (50, None, 62.79509672651086)
    assert opened.client.loop_lag_ms["max"] == 1.7239310000149999 and opened.client.limited is False
    assert opened.energy_source == "no /sys/class/powercap" and opened.server_metrics is None


def test_the_recorded_runs_records_load_with_their_point():
    records = RunDir(RECORDED).read_records()
    assert len(records) == 8 and all(isinstance(r, RequestRecord) and r.success for r in records)
    keys = {p["key"] for p in recorded_json()["points"]}
    assert {r.point for r in records} == keys and all(r.run is None for r in records)
    lines = (RECORDED / "requests.jsonl").read_text().splitlines()
    assert [RequestRecord.from_json(json.loads(line)).to_json() for line in lines] == lines


def test_each_point_and_the_settings_give_back_the_json_they_were_read_from():
    data = recorded_json()
    for point in data["points"]:
        again = PointSummary.from_json(point).to_json()
        assert again == point and list(again) == list(point)
    assert RunSettings.from_json(data["settings"]).to_json() == data["settings"]


def test_a_key_an_older_run_lacks_reads_as_its_default_and_a_later_ones_is_kept():
    point = recorded_json()["points"][0]
    older = {k: v for k, v in point.items() if k not in ("stream", "client", "steady_state", "energy_j")}
    summary = PointSummary.from_json(older)
    assert summary.stream is True and summary.client is None and summary.steady_state is None
    assert summary.energy_j is None and summary.ttft_ms == point["ttft_ms"]
    later = {**point, "a_later_figure": 1.5}
    assert PointSummary.from_json(later).to_json() == later
