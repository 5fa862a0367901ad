"""A run folder recorded with `llmopt bench` (two load points against the scripted endpoint; paths and port
made stable), committed in data/recorded_run/, read back by today's code: the guard of every move of the
bench, the run folder's types and its readers. What was written must come back byte for byte, the request
figures must be recomputed from requests.jsonl as they were, and the report's and `llmopt cost --run`'s
text must read as they did (data/recorded_run_expected.json; regenerate it only for a change that means
to change what a reader shows)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from llmopt.bench.load.load_point import PointResult
from llmopt.bench.measure.request_metrics import summarize_results
from llmopt.bench.rundir import RunDir
from llmopt.bench.slo import parse_slo
from llmopt.cli import app
from llmopt.report.html import load_runs, point_rows, run_settings, session_rows

DATA = Path(__file__).parent / "data"
RECORDED = DATA / "recorded_run"
EXPECTED = DATA / "recorded_run_expected.json"
PRICING = DATA / "recorded_run_pricing.toml"


def test_a_recorded_summary_is_rewritten_byte_for_byte(tmp_path):
    recorded = RunDir(RECORDED)
    summary = recorded.read_summary()
    again = RunDir(tmp_path / "again")
    again.path.mkdir()
    again.write_summaries(summary.points, summary.settings)
    assert again.summary.read_bytes() == recorded.summary.read_bytes()
    assert again.summary_csv.read_bytes() == recorded.summary_csv.read_bytes()


def test_the_request_figures_are_recomputed_from_the_records_as_recorded():
    run = RunDir(RECORDED)
    settings = run.read_summary().settings
    slo, percentiles = parse_slo(settings.slo), settings.percentiles
    for point in run.load_summaries():
        records = [record for record in run.read_records() if record.point == point.key]
        figures = summarize_results([PointResult(records, point.duration_s)], slo, percentiles)
        recorded = point.to_json()
        assert json.dumps(figures, indent=2) == json.dumps({k: recorded[k] for k in figures}, indent=2)


def shown() -> dict:
    """What the report's tables and `llmopt cost --run` show of the recorded run."""
    [run] = load_runs([RECORDED])
    cost = CliRunner().invoke(app, ["cost", "--run", str(RECORDED), "--pricing", str(PRICING)])
    assert cost.exit_code == 0, cost.output
    return {
        "run_settings": [list(pair) for pair in run_settings(run)],
        "point_rows": point_rows(run),
        "session_rows": session_rows(run),
        "cost": cost.output.splitlines(),
    }


def test_the_readers_show_the_recorded_run_as_they_did(tmp_path):
    assert json.dumps(shown(), indent=1, ensure_ascii=False) + "\n" == EXPECTED.read_text()


def test_the_recorded_run_is_read_in_place_and_copied(tmp_path):
    """A run folder is read wherever it lies: a copy reads the same points."""
    copy = tmp_path / "copy"
    shutil.copytree(RECORDED, copy)
    assert RunDir(copy).load_summaries() == RunDir(RECORDED).load_summaries()
