"""The run folder: summaries written and read back, records kept on resume, a torn last line dropped."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import pytest

from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.rundir import CSV_FIELDS, RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, RunSettings, ServerFigures
from llmopt.report.runs import load_run


def point(key: str, load: str, ttft: float) -> PointSummary:
    records = [
        RequestRecord(index=0, ttft=ttft, e2e=ttft + 0.5, output_tokens=6, itl=[0.1] * 5, success=True)
    ]
    summary = summarize(records, 2.0, percentiles=(50, 99))
    summary.update({"key": key, "server": "s", "prompt_len": 8, "output_len": 6, "load": load})
    summary.update({"concurrency": 1, "request_rate": None})
    return PointSummary.from_json(summary)


def record_line(key: str, index: int) -> str:
    return RequestRecord(index=index, success=True).to_json(point=key)


def test_summaries_round_trip_through_json_and_csv(tmp_path):
    run = RunDir(tmp_path)
    assert not run.is_run() and run.load_summaries() == [] and run.read_summary().settings == RunSettings()
    points = [point("a", "concurrency=1", 0.2), point("b", "concurrency=2", 0.4)]
    run.write_summaries(points, RunSettings({"num_requests": 1}))
    assert run.is_run()
    assert run.load_summaries() == points
    assert run.read_summary().settings == RunSettings({"num_requests": 1})
    rows = list(csv.reader(run.summary_csv.read_text().splitlines()))
    header = rows[0]
    assert header[: len(CSV_FIELDS)] == CSV_FIELDS
    assert header[len(CSV_FIELDS) :][:4] == ["ttft_ms_mean", "ttft_ms_median", "ttft_ms_p50", "ttft_ms_p99"]
    assert header[-1] == "e2e_ms_p99" and len(rows) == 3
    assert rows[2][header.index("load")] == "concurrency=2"
    assert float(rows[2][header.index("ttft_ms_mean")]) == pytest.approx(400)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv", "summary.json"]  # no temp files


def test_an_earlier_runs_server_figures_read_with_todays_names(tmp_path):
    """Samples, a summary's server_metrics and a round's samples written under the names earlier runs
    used read back under today's: the report and --resume get one set of names."""
    run = RunDir(tmp_path)
    run.append_server_metrics([{"point": "a", "t": 0.5, "kv_usage": 0.5, "prefix_hit_rate": 0.2}])
    [sample] = run.read_server_metrics()
    assert sample == {"point": "a", "t": 0.5, "kv_cache_usage": 0.5, "prefix_cache_hit_rate": 0.2}
    figures = {"samples": 2, "engine": "vllm", "kv_usage_max": 0.25, "prefix_hit_rate": 0.5}
    earlier, unsampled = point("a", "concurrency=1", 0.2), point("b", "concurrency=2", 0.4)
    sampled = dataclasses.replace(earlier, server_metrics=ServerFigures.from_json(figures))
    run.write_summaries([sampled, unsampled], RunSettings())
    [a, b] = run.load_summaries()
    assert a.server_metrics == ServerFigures(
        samples=2,
        engine="vllm",
        kv_cache_usage_max=0.25,
        prefix_cache_hit_rate=0.5,
    )
    assert b == unsampled and dataclasses.replace(a, server_metrics=None) == earlier
    run.append_round(
        {"point": "a", "round": 0, "runs": [{"repeat": 0, "samples": [{"t": 1, "kv_usage": 0.5}]}]}
    )
    [entry] = run.read_rounds()
    assert entry["runs"] == [{"repeat": 0, "samples": [{"t": 1, "kv_cache_usage": 0.5}]}]


def test_an_empty_run_writes_a_header_only_csv(tmp_path):
    run = RunDir(tmp_path)
    run.write_summaries([], RunSettings())
    assert run.summary_csv.read_text().strip() == ",".join(CSV_FIELDS)


def test_file_names_live_in_one_place(tmp_path):
    run = RunDir(tmp_path)
    names = [run.records, run.summary, run.summary_csv, run.report, run.server_log("batch-4")]
    assert [p.name for p in names] == [
        "requests.jsonl",
        "summary.json",
        "summary.csv",
        "report.html",
        "server-batch-4.log",
    ]
    assert all(p.parent == tmp_path for p in names)


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", "..", "/etc/x", ""])
def test_a_server_log_stays_in_the_run_folder(tmp_path, name):
    with pytest.raises(ValueError, match="server names may use letters, digits, '-', '_', '.'"):
        RunDir(tmp_path).server_log(name)


def test_a_summary_that_cannot_be_written_leaves_both_files_as_they_were(tmp_path):
    run = RunDir(tmp_path)
    run.write_summaries([point("a", "concurrency=1", 0.2)], RunSettings())
    before = (run.summary.read_text(), run.summary_csv.read_text())
    broken = dataclasses.replace(point("b", "concurrency=2", 0.4), e2e_ms={})
    with pytest.raises(KeyError):
        run.write_summaries([point("a", "concurrency=1", 0.2), broken], RunSettings())
    assert (run.summary.read_text(), run.summary_csv.read_text()) == before


def test_summaries_reach_the_disk_before_they_replace_the_old_ones(tmp_path, monkeypatch):
    synced, replaced = [], []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd)
    )
    monkeypatch.setattr(os, "replace", lambda a, b: replaced.append((str(a), str(b))) or real_replace(a, b))
    run = RunDir(tmp_path)
    run.write_summaries([point("a", "concurrency=1", 0.2)], RunSettings())
    temporaries = [str(tmp_path / ".summary.json.tmp"), str(tmp_path / ".summary.csv.tmp")]
    assert synced == temporaries
    assert replaced == [(temporaries[0], str(run.summary)), (temporaries[1], str(run.summary_csv))]

    def full_disk(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        run.write_summaries([], RunSettings())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv", "summary.json"]  # no temp files


def test_keep_records_of_drops_the_unfinished_points_records(tmp_path):
    run = RunDir(tmp_path)
    lines = [record_line("a", 0), record_line("b", 0), record_line("a", 1), record_line("c", 0)]
    with run.open_records() as out:
        out.write("".join(line + "\n" for line in lines))
    run.keep_records_of({"a", "c"})
    assert run.records.read_text() == "".join(line + "\n" for line in (lines[0], lines[2], lines[3]))
    run.keep_records_of(set())
    assert run.records.read_text() == "" and run.read_records() == []


def test_keep_records_of_without_records_does_nothing(tmp_path):
    run = RunDir(tmp_path)
    run.keep_records_of({"a"})
    assert not run.records.exists()


def test_a_torn_last_record_is_dropped_on_read_and_on_resume(tmp_path):
    run = RunDir(tmp_path)
    whole = record_line("a", 0)
    run.records.write_text(whole + "\n" + record_line("a", 1)[:25])  # killed in the middle of a write
    assert [r.index for r in run.read_records()] == [0]
    run.keep_records_of({"a"})
    assert run.records.read_text() == whole + "\n"


def test_a_bad_line_before_the_last_is_an_error_naming_it(tmp_path):
    run = RunDir(tmp_path)
    run.records.write_text(record_line("a", 0) + "\n{oops\n" + record_line("a", 2) + "\n")
    with pytest.raises(ValueError, match=r"requests.jsonl:2: not JSON"):
        run.read_records()


def test_a_corrupt_summary_is_an_error_naming_it(tmp_path):
    run = RunDir(tmp_path)
    run.summary.write_text('{"points": [')
    with pytest.raises(ValueError, match="summary.json: not JSON"):
        run.load_summaries()


def test_holds_files(tmp_path):
    run = RunDir(tmp_path / "run")
    assert not run.holds_files()
    run.path.mkdir()
    assert not run.holds_files()
    run.server_log("x").write_text("")
    assert run.holds_files()


def test_the_report_reads_runs_through_the_run_folder(tmp_path):
    run = RunDir(tmp_path / "my-run")
    run.path.mkdir()
    with pytest.raises(ValueError, match="is not a bench run"):
        load_run(run.path)
    run.write_summaries([point("a", "concurrency=1", 0.2)], RunSettings({"slo": None}))
    run.records.write_text(record_line("a", 0) + "\n" + '{"index": 1, "po')
    loaded = load_run(run.path)
    assert (loaded.name, loaded.settings, [p.key for p in loaded.points]) == (
        "my-run",
        RunSettings({"slo": None}),
        ["a"],
    )
    assert [r.index for r in loaded.records] == [0] and loaded.records_of("a")[0].point == "a"
    assert json.loads(run.summary.read_text())["points"] == [p.to_json() for p in loaded.points]
