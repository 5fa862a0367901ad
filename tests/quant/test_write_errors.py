"""A full disk (or a permission error) while the checkpoint or its report is written: one error line, no
traceback, exit 1, no staging folder, and an old checkpoint under --out untouched. safetensors reports a
full disk as its own SafetensorError, not an OSError (seen on a 256 KiB tmpfs), so both are faked."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from safetensors import SafetensorError

from llmopt.quant.quant_report import REPORT_FILE
from tests.quant.conftest import error_lines, leftovers, names

FULL = "No space left on device"


def fail_report_writes(monkeypatch) -> None:
    real = Path.write_text

    def write_text(self: Path, *args, **kwargs):
        if self.name == REPORT_FILE:
            raise OSError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("weights: OSError", f"{FULL}: "),
        ("weights: SafetensorError", f"I/O error: {FULL} (os error 28)"),
        ("report", "Permission denied: "),
    ],
)
@pytest.mark.parametrize("existing", [False, True])
def test_a_write_error_is_one_line_and_leaves_nothing(
    fake_job, tmp_path, monkeypatch, capsys, failure, message, existing
):
    out = tmp_path / "ckpt"
    if existing:
        out.mkdir()
        (out / "old.txt").write_text("the previous checkpoint")
    if failure == "weights: OSError":
        fake_job.oneshot_error = OSError(
            errno.ENOSPC, FULL, str(tmp_path / ".ckpt-staging" / "model.safetensors")
        )
    elif failure == "weights: SafetensorError":
        fake_job.oneshot_error = SafetensorError(f"Error while serializing: I/O error: {FULL} (os error 28)")
    else:
        fail_report_writes(monkeypatch)
    assert fake_job.cli(out, overwrite=True) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert f"quantizing into {out} stopped: " in line and message in line, line
    assert fake_job.staged and leftovers(tmp_path) == []
    assert names(out) == ["old.txt"] if existing else not out.exists()
