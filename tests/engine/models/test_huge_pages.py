"""The saved model's file in the page cache as 2 MB folios: written in whole 2 MB pieces, and read again
where the cache holds it in 4 KB pages."""

from __future__ import annotations

import io
import os
import random

import pytest

from llmopt.engine.models import huge_pages
from llmopt.engine.models.huge_pages import HUGE_PAGE, WholePages


class RecordedFile(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, int]] = []

    def write(self, data) -> int:
        self.writes.append((self.tell(), len(memoryview(data).cast("B"))))
        return super().write(data)


def test_writes_reach_the_file_in_whole_pages_at_page_offsets():
    rng = random.Random(0)
    sizes = [0, 1, 100, HUGE_PAGE - 1, HUGE_PAGE, HUGE_PAGE + 3, 3 * HUGE_PAGE + 5, 7, HUGE_PAGE // 2]
    for _ in range(20):
        file, expected = RecordedFile(), bytearray()
        writer = WholePages(file)
        for size in rng.choices(sizes, k=12):
            data = rng.randbytes(size)
            assert writer.write(data) == size
            expected += data
        writer.finish()
        assert file.getvalue() == expected
        *whole, last = file.writes
        assert all(offset % HUGE_PAGE == 0 and size % HUGE_PAGE == 0 for offset, size in whole)
        assert last[0] % HUGE_PAGE == 0 and last[0] + last[1] == len(expected)


def in_small_pages(path) -> None:
    """Drop `path` from the page cache and read it back a 4 KB page at a time, last page first, so that
    no read-ahead makes larger folios."""
    huge_pages.drop_from_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for offset in range(path.stat().st_size - 4096, -1, -4096):
            os.pread(fd, 1, offset)
    finally:
        os.close(fd)


@pytest.fixture
def written(tmp_path):
    """An 8 MB file written through WholePages, where this system caches files in 2 MB folios."""
    path = tmp_path / "model.pt"
    with path.open("wb") as f:
        writer = WholePages(f)
        writer.write(random.Random(1).randbytes(4 * HUGE_PAGE))
        writer.finish()
    share = huge_pages.cache_in_huge_pages(path)
    if share is None or share < huge_pages.ENOUGH:
        pytest.skip(f"no 2 MB folios for files here (huge pages off, or this file system): {share}")
    return path


def test_a_file_cached_in_small_pages_is_read_again_in_2mb_ones(written):
    in_small_pages(written)
    assert huge_pages.populate(written) < 0.5
    assert huge_pages.cache_in_huge_pages(written) >= huge_pages.ENOUGH
    assert huge_pages.populate(written) >= huge_pages.ENOUGH  # and stays so for the next mapping


def test_a_file_cached_in_2mb_pages_is_not_read_again(written, monkeypatch):
    monkeypatch.setattr(huge_pages, "drop_from_page_cache", lambda path: pytest.fail("read again"))
    assert huge_pages.cache_in_huge_pages(written) >= huge_pages.ENOUGH


def test_nothing_happens_without_transparent_huge_pages(tmp_path, monkeypatch):
    thp = tmp_path / "enabled"
    thp.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", thp)
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(4 * HUGE_PAGE))
    monkeypatch.setattr(huge_pages, "populate", lambda path: pytest.fail("mapped"))
    assert huge_pages.cache_in_huge_pages(path) is None


def test_a_file_system_that_refuses_leaves_the_file_as_it_is(written, monkeypatch):
    def refuse(fd):
        raise OSError(22, "Invalid argument")

    in_small_pages(written)
    monkeypatch.setattr(os, "fsync", refuse)
    assert huge_pages.cache_in_huge_pages(written) is None
