"""Leftovers of killed runs beside --out: their staging folders are removed on the next run of the same
--out, an old checkpoint moved aside is put back; anything of a live process, or of another --out, stays.
Each run's folders carry its pid, so the owner can be told."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmopt.quant.quantize import quantize
from tests.quant.conftest import leftovers, names


@pytest.fixture(scope="module")
def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def folder(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"half written")
    return path


def test_a_killed_runs_staging_is_removed_and_a_live_ones_kept(fake_job, tmp_path, dead_pid):
    stale = folder(tmp_path / f".ckpt-staging-{dead_pid}-a1b2c3d4")
    live = folder(tmp_path / f".ckpt-staging-{os.getpid()}-a1b2c3d4")
    other_out = folder(tmp_path / f".ckpt2-staging-{dead_pid}-a1b2c3d4")
    quantize(fake_job.config(tmp_path / "ckpt"))
    assert fake_job.staged[0].name.startswith(f".ckpt-staging-{os.getpid()}-")
    assert not stale.exists()
    assert live.exists() and other_out.exists()
    assert leftovers(tmp_path) == sorted([live.name, other_out.name])


def test_an_old_checkpoint_moved_aside_by_a_killed_run_goes_back(fake_job, tmp_path, dead_pid):
    old = folder(tmp_path / f".ckpt-old-{dead_pid}")
    out = tmp_path / "ckpt"
    with pytest.raises(ValueError, match="already exists"):  # back in place: not replaced unasked
        quantize(fake_job.config(out))
    assert names(out) == ["model.safetensors"] and not old.exists()


def test_an_old_checkpoint_a_killed_run_did_not_finish_deleting_is_removed(fake_job, tmp_path, dead_pid):
    old = folder(tmp_path / f".ckpt-old-{dead_pid}")
    quantize(fake_job.config(folder(tmp_path / "ckpt"), overwrite=True))
    assert not old.exists() and leftovers(tmp_path) == []
