"""The saved model's file (loaded_model_cache.py) in the page cache as 2 MB folios, so that the mapping a
start reads its weights through is made of 2 MB pages instead of 4 KB ones: a decoding step streams every
weight once, and one TLB entry then covers 512 times the bytes. On the 1.5B, against the same file cached
in 4 KB pages, engines taking turns step by step ran 1.02-1.03x at one stream and 1.005x at four
(`benchmarks/huge_pages.py`, every pair above 1.0x, greedy text equal). A start finds the file in small
folios where the cache was filled by small reads: one that had served all day had 33 % of it in 2 MB
folios; torch.save's own writes leave 80 % (WholePages below: all of it).

Linux with transparent huge pages (`always` or `madvise`) and a file system that caches large folios
(ext4 and xfs on 6.x kernels). Elsewhere nothing here changes anything: the file maps as before.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from pathlib import Path
from typing import BinaryIO

import torch

log = logging.getLogger(__name__)
HUGE_PAGE = 2 << 20
MADV_POPULATE_READ = 22  # Linux 5.14; Python's mmap module does not name it
ENOUGH = 0.9  # share of a file's whole 2 MB pages mapped as such; a start that finds less reads it again
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


class WholePages:
    """Passes writes on to `file` in whole 2 MB pieces at 2 MB offsets, so that the page cache keeps each
    as one folio. torch.save's own writes start wherever its records end: of the 1.5B's file written
    that way, 81 % came back in 2 MB pages; written through this, all of it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.pending = bytearray()

    def write(self, data: bytes) -> int:
        """Whole pieces of `data` go straight to the file (a tensor's bytes are not copied); only the
        part of a piece still short of 2 MB waits in `pending`."""
        view = memoryview(data).cast("B")
        size = len(view)
        if self.pending:
            taken = min(size, HUGE_PAGE - len(self.pending))
            self.pending += view[:taken]
            view = view[taken:]
            if len(self.pending) < HUGE_PAGE:
                return size
            self.file.write(self.pending)
            self.pending = bytearray()
        whole = len(view) // HUGE_PAGE * HUGE_PAGE
        if whole:
            self.file.write(view[:whole])
        self.pending += view[whole:]
        return size

    def flush(self) -> None:
        """Nothing: a piece shorter than 2 MB waits for the rest (finish() writes the last one)."""

    def finish(self) -> None:
        self.file.write(self.pending)
        self.pending = bytearray()
        self.file.flush()


def save(obj: object, file: BinaryIO) -> None:
    writer = WholePages(file)
    torch.save(obj, writer)
    writer.finish()


def cache_in_huge_pages(path: Path) -> float | None:
    """Bring `path` into the page cache as 2 MB folios, reading it again from disk where the cache holds
    it in smaller ones (pages another process maps stay as they are), and return the share of its whole
    2 MB pages a mapping then sees as such; None where the system cannot tell or cannot do it."""
    if not huge_pages_possible() or path.stat().st_size < HUGE_PAGE:
        return None
    try:
        share = populate(path)
        if share is not None and share < ENOUGH:
            drop_from_page_cache(path)
            share = populate(path)
    except OSError as exc:  # a file system that refuses fsync or the advice: the file maps as it is
        log.info("could not cache %s in 2 MB pages (%s)", path, exc)
        return None
    return share


def huge_pages_possible() -> bool:
    try:
        setting = THP_SETTING.read_text()
    except OSError:  # not Linux, or a kernel without transparent huge pages
        return False
    return "[always]" in setting or "[madvise]" in setting


def populate(path: Path) -> float | None:
    """Map `path`, asking for 2 MB pages, fault all of it in and return the share of its whole 2 MB pages
    mapped as such. Faults under MADV_HUGEPAGE read what is not cached yet in 2 MB folios; what is cached
    stays in the folios it has."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as view:
        view.madvise(mmap.MADV_HUGEPAGE)
        try:
            view.madvise(MADV_POPULATE_READ)
        except OSError:  # a kernel before 5.14
            return None
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        mapped = pmd_mapped_bytes(address)
        return None if mapped is None else mapped / (len(view) // HUGE_PAGE * HUGE_PAGE)


def pmd_mapped_bytes(address: int) -> int | None:
    """FilePmdMapped of this process's mapping that starts at `address`, from /proc/self/smaps."""
    header = f"{address:x}-"
    in_mapping = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                in_mapping = line.startswith(header)
            elif in_mapping and line.startswith("FilePmdMapped:"):
                return int(line.split()[1]) * 1024
    return None


def drop_from_page_cache(path: Path) -> None:
    """Drop `path`'s pages from the page cache (written back first: a dirty page is not dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
