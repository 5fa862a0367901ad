"""Moving the finished checkpoint into place: an old one (--overwrite) is replaced whole; if the new one
cannot be moved in, the old one goes back under --out and the user is told; an existing --out without
--overwrite and a Ctrl-C leave everything as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import llmopt.quant.out_folder
from llmopt.quant.quant_report import REPORT_FILE
from llmopt.quant.quantize import quantize
from tests.quant.conftest import error_lines, leftovers, names

CHECKPOINT = ["config.json", "model.safetensors", REPORT_FILE, "tokenizer.json"]


def old_checkpoint(out: Path) -> Path:
    out.mkdir()
    (out / "old.txt").write_text("the previous checkpoint")
    return out


def fail_renames(monkeypatch, calls: set[int]) -> None:
    """os.rename fails (EACCES) on the given calls, counted from 1."""
    real, count = os.rename, [0]

    def rename(src, dst, *args, **kwargs):
        count[0] += 1
        if count[0] in calls:
            raise OSError(errno.EACCES, "Permission denied", str(src), None, str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)


def test_a_failed_move_into_place_puts_the_old_checkpoint_back(fake_job, tmp_path, monkeypatch, capsys):
    out = old_checkpoint(tmp_path / "ckpt")
    fail_renames(monkeypatch, {2})  # 1: old aside, 2: new in
    assert fake_job.cli(out, overwrite=True) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert "could not move the new checkpoint into" in line and "previous checkpoint is back in place" in line
    assert names(out) == ["old.txt"]
    assert leftovers(tmp_path) == []  # the new checkpoint was removed, as the line says


def test_a_failed_move_with_no_old_checkpoint_leaves_nothing(fake_job, tmp_path, monkeypatch):
    fail_renames(monkeypatch, {1})
    with pytest.raises(Exception, match="could not move the new checkpoint into .*it was removed"):
        quantize(fake_job.config(tmp_path / "ckpt"))
    assert names(tmp_path) == ["model"]


def test_an_old_checkpoint_that_cannot_go_back_is_kept_and_named(fake_job, tmp_path, monkeypatch):
    out = old_checkpoint(tmp_path / "ckpt")
    fail_renames(monkeypatch, {2, 3})  # new in, and old back
    with pytest.raises(Exception, match="previous checkpoint could not be moved back") as failure:
        quantize(fake_job.config(out, overwrite=True))
    kept = tmp_path / f".ckpt-old-{os.getpid()}"
    assert str(kept) in str(failure.value) and names(kept) == ["old.txt"]
    assert leftovers(tmp_path) == [kept.name]
    # The next run, once this process is gone, moves it back, and so refuses to replace it unasked.
    monkeypatch.undo()
    monkeypatch.setattr(llmopt.quant.out_folder, "process_alive", lambda pid: False)
    with pytest.raises(ValueError, match="already exists"):
        quantize(fake_job.config(out))
    assert names(out) == ["old.txt"] and leftovers(tmp_path) == []


def test_overwrite_replaces_the_old_checkpoint_whole(fake_job, tmp_path):
    out = old_checkpoint(tmp_path / "ckpt")
    report = quantize(fake_job.config(out, overwrite=True))
    assert names(out) == CHECKPOINT and report.out == str(out.resolve())
    assert leftovers(tmp_path) == []


def test_an_existing_out_is_refused_without_overwrite(fake_job, tmp_path, capsys):
    out = old_checkpoint(tmp_path / "ckpt")
    assert fake_job.cli(out) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert "already exists: choose another --out or pass --overwrite" in line
    assert names(out) == ["old.txt"] and not fake_job.staged and leftovers(tmp_path) == []


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_while_writing_leaves_everything_as_it_was(fake_job, tmp_path, existing):
    out = tmp_path / "ckpt"
    if existing:
        old_checkpoint(out)
    fake_job.oneshot_error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        quantize(fake_job.config(out, overwrite=True))
    assert fake_job.staged and not fake_job.staged[0].exists()
    assert leftovers(tmp_path) == []
    assert names(out) == ["old.txt"] if existing else not out.exists()
