"""The machine's cost of a token in the per-point table (the report's and the console's) and the line
under it that says where each server's figures came from, or why a cell reads "-". Synthetic run
folders: no model, no server."""

from __future__ import annotations

import pytest

from llmopt.cli.render import results_table
from llmopt.report.html import POINT_HEADERS, point_rows, write_report
from llmopt.report.machine_cost import cost_source_lines
from llmopt.report.runs import load_run
from tests.run_folders import FakePoint, write_run

MEASURED = {
    "server_cpu_s": 6.0,
    "server_cores": 1.5,
    "cpu_s_per_1k_tokens": 15.0,
    "cpu_source": "process tree (psutil)",
    "energy_j": 120.0,
    "joules_per_token": 0.3,
    "energy_source": "rapl",
    "energy_domains": ["package-0", "dram"],
}
UNREADABLE = {
    **MEASURED,
    "server_cpu_s": None,
    "server_cores": None,
    "cpu_s_per_1k_tokens": None,
    "cpu_source": "no process_cpu_seconds_total on the server's /metrics",
    "energy_j": None,
    "joules_per_token": None,
    "energy_source": "no /sys/class/powercap",
    "energy_domains": None,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    points = [FakePoint(8, extra=MEASURED), FakePoint(8, server="remote", extra=UNREADABLE)]
    return load_run(write_run(tmp_path_factory.mktemp("cost") / "run", points))


def test_the_point_table_has_cpu_cores_and_joules_per_token(run):
    measured, unreadable = (dict(zip(POINT_HEADERS, row)) for row in point_rows(run))
    assert measured["server CPU (s per 1k out)"] == "15.00" and measured["server cores (CPU s / s)"] == "1.50"
    assert measured["energy (J per out token)"] == "0.300"
    cells = [unreadable[h] for h in POINT_HEADERS if h.startswith(("server CPU", "server cores", "energy"))]
    assert cells == ["-", "-", "-"]  # not available: never a 0


def test_each_server_says_where_its_figures_came_from(run):
    assert cost_source_lines(run.points) == [
        "local: server CPU from process tree (psutil); energy per token from RAPL (package-0 + dram, the "
        "whole machine's)",
        "remote: server CPU: not available (no process_cpu_seconds_total on the server's /metrics); energy "
        "per token: not available here (no /sys/class/powercap)",
    ]


def test_the_console_table_shows_the_same_columns(run):
    columns = {str(c.header): list(c.cells) for c in results_table(run.points).columns}
    assert columns["CPU s/1k tok"] == ["15.00", "-"] and columns["cores"] == ["1.50", "-"]
    assert columns["J/tok"] == ["0.300", "-"]


@pytest.mark.slow
def test_the_report_shows_the_figures_and_their_sources(run, tmp_path):
    html = write_report([run.path], tmp_path / "r.html").read_text()
    assert "server CPU (s per 1k out)" in html and "energy (J per out token)" in html
    assert "energy per token: not available here (no /sys/class/powercap)" in html
