"""The report never shows a server's API key, even from a run folder that an older bench wrote with the
key in its points' server arguments."""

from __future__ import annotations

import pytest

from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, RunSettings
from llmopt.report.html import run_settings, write_report
from llmopt.report.runs import load_run

SECRET = "sk-old-run-Qw3rTy8uIo"


KEY = "local|prompt=8|output=5|concurrency=1"
RECORD = RequestRecord(index=0, ttft=0.1, e2e=0.5, output_tokens=5, itl=[0.1] * 4, success=True)


def old_point(args: dict) -> PointSummary:
    summary = summarize([RECORD], 1.0)
    summary.update({"key": KEY, "server": "local", "prompt_len": 8})
    summary.update({"output_len": 5, "load": "concurrency=1", "concurrency": 1, "request_rate": None})
    summary.update({"model": "m", "endpoint": "http://127.0.0.1:1/v1", "server_args": args})
    return PointSummary.from_json(summary)


@pytest.mark.slow
def test_a_key_in_old_server_args_is_not_in_the_report(tmp_path):
    run = RunDir(tmp_path / "old")
    run.path.mkdir()
    run.write_summaries([old_point({"api-key": SECRET, "max-num-seqs": 2})], RunSettings({"slo": None}))
    run.records.write_text(RECORD.to_json(point=KEY) + "\n")
    out = write_report([run.path], tmp_path / "report.html")
    html = out.read_text()
    assert SECRET not in html and "max-num-seqs" in html
    settings = dict(run_settings(load_run(run.path)))
    assert settings["server configs"] == "local: {'api-key': '***', 'max-num-seqs': 2}"
