"""What `llmopt quantize` reports: the KL divergence from the source, before and after, in
quant_report.json and in the printed table, and none with --no-kld. The job's expensive steps are faked
(tests/quant/conftest.py); the report is the real one."""

from __future__ import annotations

import json

from llmopt.quant.quant_report import REPORT_FILE
from llmopt.quant.quantize import quantize


def test_the_report_holds_the_kl_divergence_from_the_source(fake_job, tmp_path):
    out = tmp_path / "out"
    report = quantize(fake_job.config(out))
    # The source against itself in float32, then the staged checkpoint against the source.
    [(source, reference), (staged, reference_after)] = fake_job.evaluated
    assert source == reference == reference_after == str(fake_job.model) and staged == str(fake_job.staged[0])
    written = json.loads((out / REPORT_FILE).read_text())
    assert written["kl_divergence_before"]["mean"] == 0.01 and report.kl_divergence_before.mean == 0.01
    assert written["kl_divergence_after"] == {
        "mean": 0.02,
        "median": 0.02,
        "p99": 0.02,
        "p999": 0.02,
        "max": 0.02,
        "top1_agreement": 0.98,
        "delta_p_mean": -0.02,
        "tokens": 127,
    }


def test_no_kld_asks_for_no_reference(fake_job, tmp_path):
    out = tmp_path / "out"
    quantize(fake_job.config(out, kl_divergence=False))
    assert [reference for _, reference in fake_job.evaluated] == [None, None]
    written = json.loads((out / REPORT_FILE).read_text())
    assert written["kl_divergence_before"] is None and written["kl_divergence_after"] is None


def test_the_printed_table_shows_the_kl_divergence(fake_job, tmp_path, capsys):
    assert fake_job.cli(tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert "next-token distribution vs the source in fp32" in printed
    [mean] = [line for line in printed.splitlines() if "mean KLD" in line]
    assert "0.010000" in mean and "0.020000" in mean
    assert "98.00 %" in printed
