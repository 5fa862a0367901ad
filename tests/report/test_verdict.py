"""`llmopt report BASE NEW --fail-if ...` on two synthetic runs: exit 1 when a condition holds at a
matched point (with the table of what moved), 0 when none does or when the change is within the noise of
the requests, 2 for a condition it cannot read or runs with nothing to compare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmopt.report.runs import load_run
from llmopt.report.verdict import change_interval, parse_conditions, verdict
from tests.run_folders import FakePoint, write_run


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "report", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("verdict")
    return {
        "base": write_run(base / "base", [FakePoint(60, 0.100, 10.0)]),
        # TTFT half as long again, the same throughput
        "slower": write_run(base / "slower", [FakePoint(60, 0.150, 10.0, seed=1)]),
        # TTFT 3 % longer (within the jitter), throughput down by a sixth: 60 requests in 12 s
        "busier": write_run(base / "busier", [FakePoint(60, 0.103, 12.0, seed=2)]),
    }


@pytest.mark.slow
def test_a_slower_ttft_fails_the_build(runs, tmp_path):
    out = tmp_path / "r.html"
    result = report(str(runs["base"]), str(runs["slower"]), "--out", str(out), "--fail-if", "ttft_p99>+10%")
    assert result.returncode == 1, result.stderr
    assert "FAILS" in result.stdout and "ttft_p99>+10%" in result.stdout and "slower: local" in result.stdout
    assert "FAIL" in result.stderr
    html = out.read_text()  # the report is written all the same, the verdict at its head
    assert "--fail-if: 1 of 1 check(s) fail" in html
    assert html.index("--fail-if: 1 of 1") < html.index("Run settings")


@pytest.mark.slow
def test_noise_does_not_fail_the_build_and_throughput_does(runs, tmp_path):
    args = [str(runs["base"]), str(runs["busier"]), "--out", str(tmp_path / "r.html")]
    ok = report(*args, "--fail-if", "ttft_p99>+10%,ttft_median>+10%")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: none of 2 check(s) holds" in ok.stderr
    slower = report(*args, "--fail-if", "output_throughput<-5%")
    assert slower.returncode == 1 and "-16.7" in slower.stdout


def test_a_change_within_the_requests_noise_does_not_hold(tmp_path):
    # 5 requests each: one slow request in NEW doubles its p99, but resampling shows it could be chance
    base = write_run(tmp_path / "b", [FakePoint(5, ttfts=[0.1] * 5)])
    new = write_run(tmp_path / "n", [FakePoint(5, ttfts=[0.1, 0.1, 0.1, 0.1, 0.2])])
    [check] = verdict([load_run(base), load_run(new)], parse_conditions("ttft_p99>+10%"))
    assert check.change > 90 and check.interval[0] <= 0 and not check.holds
    # with 60 requests of each the same slowdown is no chance
    assert change_interval([0.1] * 60, [0.15] * 60, "p99") == (pytest.approx(50), pytest.approx(50))


@pytest.mark.parametrize(
    "condition, message",
    [
        ("ttft_p99>10", "write METRIC>+N% or METRIC<-N%"),
        ("speed<-5%", "unknown metric 'speed'"),
        (",", "at least one"),
    ],
)
@pytest.mark.slow
def test_a_condition_it_cannot_read_is_a_usage_error(runs, tmp_path, condition, message):
    result = report(
        str(runs["base"]), str(runs["slower"]), "--out", str(tmp_path / "r.html"), "--fail-if", condition
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_nothing_to_compare_is_a_usage_error(runs, tmp_path):
    result = report(str(runs["base"]), "--out", str(tmp_path / "r.html"), "--fail-if", "ttft_p99>+10%")
    assert result.returncode == 2 and "no point matched" in result.stderr
    other = write_run(tmp_path / "other", [FakePoint(10, prompt_tokens=999)])
    result = report(
        str(runs["base"]), str(other), "--out", str(tmp_path / "r.html"), "--fail-if", "ttft_p99>+10%"
    )
    assert result.returncode == 2


def repeated(values: list[float]) -> dict:
    """A point's "repeats" block as `llmopt bench --num-runs` writes it (bench/sweep/repeats.py)."""
    return {"repeats": {"runs": len(values), "metrics": {"output_throughput": {"values": values}}}}


def test_repeated_runs_judge_throughput_by_their_spread(tmp_path):
    # Pooled, both NEW runs are 10 % slower (60 -> 54 tok/s); run to run, BASE itself varied by 20 %.
    base = write_run(tmp_path / "b", [FakePoint(60, wall_s=10.0, extra=repeated([50.0, 70.0, 60.0]))])
    noisy = write_run(tmp_path / "n", [FakePoint(60, wall_s=10 / 0.9, extra=repeated([45.0, 63.0, 54.0]))])
    steady = write_run(tmp_path / "s", [FakePoint(60, wall_s=10 / 0.9, extra=repeated([53.5, 54.5, 54.0]))])
    tight = write_run(tmp_path / "t", [FakePoint(60, wall_s=10.0, extra=repeated([59.5, 60.5, 60.0]))])
    conditions = parse_conditions("output_throughput<-5%")
    [check] = verdict([load_run(base), load_run(noisy)], conditions)
    assert check.change == pytest.approx(-10) and check.interval[1] > -5 and not check.holds
    [check] = verdict([load_run(tight), load_run(steady)], conditions)
    assert check.change == pytest.approx(-10) and check.interval[1] < -5 and check.holds
