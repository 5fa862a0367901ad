"""What a start builds from a model's files, kept on disk: built once, read after, rebuilt when broken,
whole when two processes write it at once, and no more than KEEP files a folder."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from llmopt.load_cache import load_or_build


def read(path: Path) -> object:
    return pickle.loads(path.read_bytes())


def test_built_once_then_read(tmp_path):
    builds = []
    path = tmp_path / "saved" / "k.pkl"

    def build() -> dict:
        builds.append(1)
        return {"vocab": list(range(5))}

    assert load_or_build(path, build, read, pickle.dump) == {"vocab": list(range(5))}
    assert load_or_build(path, build, read, pickle.dump) == {"vocab": list(range(5))}
    assert len(builds) == 1 and path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["k.pkl"], "no temporary file may be left"


def test_a_start_that_builds_can_return_the_saved_copy(tmp_path):
    path = tmp_path / "k.pkl"

    def read_marked(path: Path) -> tuple:
        return ("read", read(path))

    assert load_or_build(path, lambda: 5, read_marked, pickle.dump, read_back=True) == ("read", 5)
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would go")
    assert load_or_build(blocked / "k.pkl", lambda: 5, read_marked, pickle.dump, read_back=True) == 5


def test_a_broken_file_is_built_again_and_replaced(tmp_path, caplog):
    path = tmp_path / "k.pkl"
    path.write_bytes(b"\x80\x04truncated")
    assert load_or_build(path, lambda: "fresh", read, pickle.dump) == "fresh"
    assert "did not load" in caplog.text
    assert read(path) == "fresh"


def test_an_unwritable_folder_costs_only_the_build(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would go")
    assert load_or_build(blocked / "k.pkl", lambda: 7, read, pickle.dump) == 7
    assert "could not save" in caplog.text


def test_a_folder_keeps_its_newest_files_when_asked(tmp_path):
    for i in range(4):
        load_or_build(tmp_path / f"{i}.pkl", lambda i=i: i, read, pickle.dump)
        os.utime(tmp_path / f"{i}.pkl", ns=(i * 10**9, i * 10**9))
    assert len(list(tmp_path.iterdir())) == 4  # no pruning unless asked
    load_or_build(tmp_path / "4.pkl", lambda: 4, read, pickle.dump, keep=2)
    assert sorted(int(p.stem) for p in tmp_path.iterdir()) == [3, 4]


WRITER = """
import pickle, sys, time
from pathlib import Path
from llmopt.load_cache import load_or_build
def build():
    time.sleep(0.3)  # both processes find no file, then both write
    return list(range(200_000))
value = load_or_build(Path(sys.argv[1]), build, lambda p: pickle.loads(p.read_bytes()), pickle.dump)
print(len(value))
"""


@pytest.mark.slow
def test_two_processes_saving_at_once_leave_one_whole_file(tmp_path):
    path = tmp_path / "k.pkl"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and outputs == ["200000\n"] * 2
    assert read(path) == list(range(200_000))
    assert [p.name for p in tmp_path.iterdir()] == ["k.pkl"], "no temporary file may be left"
