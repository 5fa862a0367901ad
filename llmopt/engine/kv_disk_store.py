"""The KV disk tier's files: one folder a model (kv_block_file.py names it) under $LLMOPT_CACHE/kv
(default ~/.cache/llmopt/kv; $LLMOPT_KV_DIR puts the tier elsewhere, e.g. on a faster disk or, for a
test session, somewhere of its own), one file a block, bounded in bytes, least recently used out first.

Writes go through a background thread, so the engine thread only copies an evicted block out of the
pool: the thread takes whatever is queued at once (a batch) and writes each file under a temporary
name, then renames it into place. It starts with the first write and ends after a few idle seconds (an
engine that never evicts never has it). A write that fails (disk full) is dropped and counted: the
block is computed again when asked for, as without the tier. Reads run on the caller's thread (the
engine's, which needs the block before its step); a file that reads as no block (kv_block_file.py) is
deleted and counts as a miss.

The bound is on the whole kv folder: at start the files there are counted, and files of other models
or other formats (other folders) are evicted before any of this model's. Two servers of one model share
its folder (a file is whole or absent; a block one deleted reads as a miss in the other).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmopt.checkpoints import cache_dir
from llmopt.engine.kv_block_file import digest_of, file_name, file_size, read_block, write_block
from llmopt.engine.models.huge_pages import drop_from_page_cache

log = logging.getLogger(__name__)
GIB = 2**30
# --kv-disk-gb's default: this share of the disk free under the cache folder (the tier's own files
# counted as free), at most DEFAULT_MAX_GB.
DEFAULT_SHARE = 0.10
DEFAULT_MAX_GB = 20.0
# Copies waiting for the writer, at most: past it an evicted block is not written (counted as dropped)
# rather than the engine waiting on the disk or holding more memory beside the pool.
MAX_PENDING_BYTES = 256 * 2**20
IDLE_EXIT_S = 5.0  # the writer thread ends after this long with nothing to write
STALE_TEMPORARY_S = 600.0  # a temporary file this old is a crashed writer's, not a live one's
PROBE_FILES = 4


KV_DIR_ENV = "LLMOPT_KV_DIR"


def tier_root() -> Path:
    where = os.environ.get(KV_DIR_ENV)
    return Path(where) if where else cache_dir().parent / "kv"


def default_budget_bytes(root: Path, used: int) -> int:
    """DEFAULT_SHARE of the disk free under `root` plus what the tier holds already, at most
    DEFAULT_MAX_GB."""
    existing = root
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    return int(min(DEFAULT_SHARE * (free + used), DEFAULT_MAX_GB * GIB))


@dataclass
class StoreStats:
    blocks_written: int = 0
    bytes_written: int = 0
    write_errors: int = 0
    writes_dropped: int = 0  # queued past MAX_PENDING_BYTES
    files_evicted: int = 0  # over the budget
    bad_files: int = 0  # indexed, but read as no block (torn, corrupted, deleted by another process)


@dataclass
class PendingBlock:
    digest: bytes
    token_ids: tuple[int, ...]
    payload: np.ndarray  # uint8, the pool's bytes
    generation: int  # clear() makes every older pending block stale


class KVDiskStore:
    """The files of one model's folder, their index (digest -> file size, least recently used first) and
    the writer thread."""

    def __init__(self, root: Path, folder: str, budget_gb: float | None, block_size: int, payload_bytes: int):
        self.root = root
        self.folder = root / folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.block_size = block_size
        self.payload_bytes = payload_bytes
        self.file_bytes = file_size(block_size, payload_bytes)
        self.index: OrderedDict[bytes, int] = OrderedDict()
        self.foreign: deque[tuple[Path, int]] = deque()  # other folders' files, oldest first
        self.used = 0
        self.stats = StoreStats()
        self._cond = threading.Condition()
        self._queue: deque[PendingBlock] = deque()
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._scan()
        self.budget = int(budget_gb * GIB) if budget_gb is not None else default_budget_bytes(root, self.used)
        with self._cond:
            victims = self._over_budget()
        unlink_all(victims, keep=self.folder)

    def _scan(self) -> None:
        """Index this folder's block files by age (modification time: a read touches it) and list the
        other folders' files; remove temporary files a crashed writer left."""
        own: list[tuple[float, bytes, int]] = []
        foreign: list[tuple[float, Path, int]] = []
        now = time.time()
        for folder in (f for f in self.root.iterdir() if f.is_dir()):
            for entry in os.scandir(folder):
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                if entry.name.endswith(".tmp"):
                    if now - stat.st_mtime > STALE_TEMPORARY_S:
                        unlink_all([Path(entry.path)], keep=folder)
                    continue
                digest = digest_of(entry.name) if folder == self.folder else None
                if digest is not None and stat.st_size == self.file_bytes:
                    own.append((stat.st_mtime, digest, stat.st_size))
                elif entry.is_file():
                    foreign.append((stat.st_mtime, Path(entry.path), stat.st_size))
        for _, digest, size in sorted(own):
            self.index[digest] = size
        self.foreign.extend((path, size) for _, path, size in sorted(foreign))
        self.used = sum(self.index.values()) + sum(size for _, size in self.foreign)

    # ---- the engine's side ---------------------------------------------------------------------------
    def __contains__(self, digest: bytes) -> bool:
        return digest in self.index or digest in self._pending

    def hits(self, digests: list[bytes]) -> int:
        """How many of `digests`, from the first, have a file."""
        count = 0
        for digest in digests:
            if digest not in self.index:
                break
            count += 1
        return count

    def put(
        self, digest: bytes, token_ids: tuple[int, ...], payload: np.ndarray, wait_s: float = 0.0
    ) -> bool:
        """Queue a block for writing (False: dropped, the queue being full for `wait_s` seconds)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            if digest in self.index or digest in self._pending:
                return True
            while self._pending_bytes + payload.nbytes > MAX_PENDING_BYTES and self._pending_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.stats.writes_dropped += 1
                    return False
                self._cond.wait(remaining)
            self._queue.append(PendingBlock(digest, token_ids, payload, self._generation))
            self._pending.add(digest)
            self._pending_bytes += payload.nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="llmopt-kv-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def read(self, digest: bytes, token_ids: tuple[int, ...]) -> np.ndarray | None:
        """A block's payload, or None: no file, or one that is not this block whole (then deleted)."""
        path = self.folder / file_name(digest)
        payload = read_block(path, digest, token_ids, self.payload_bytes)
        with self._cond:
            size = self.index.pop(digest, None) if payload is None else None
            if payload is not None and digest in self.index:
                self.index.move_to_end(digest)
            if size is not None:
                self.used -= size
                self.stats.bad_files += 1
        if payload is None:
            unlink_all([path], keep=self.folder)
            return None
        try:
            os.utime(path)  # its age for the next start's order
        except OSError:
            pass
        return payload

    def clear(self) -> int:
        """Forget and delete every block of this folder (queued ones too); return how many files."""
        with self._cond:
            self.used -= sum(self.index.values())
            self.index.clear()
            self._generation += 1
            for item in self._queue:
                self._pending.discard(item.digest)
                self._pending_bytes -= item.payload.nbytes
            self._queue.clear()
            self._cond.notify_all()
        paths = [Path(e.path) for e in os.scandir(self.folder) if e.name.endswith(".kv")]
        unlink_all(paths, keep=self.folder)
        return len(paths)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued block is written (True) or `timeout_s` has passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout_s)

    # ---- the writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # below the engine's threads
        except (OSError, AttributeError):
            pass
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait(IDLE_EXIT_S)
                if not self._queue:
                    self._thread = None
                    return
                batch = list(self._queue)
                self._queue.clear()
            self._commit([(item, self._write(item)) for item in batch])

    def _write(self, item: PendingBlock) -> int | None:
        try:
            return write_block(
                self.folder / file_name(item.digest), item.digest, item.token_ids, item.payload
            )
        except Exception as exc:  # a block not written is computed when asked for: never the writer's end
            if not self.stats.write_errors:
                log.warning(
                    "KV disk tier: a block could not be written (%s); such blocks are recomputed", exc
                )
            self.stats.write_errors += 1
            return None

    def _commit(self, written: list[tuple[PendingBlock, int | None]]) -> None:
        """Index the files a batch wrote (a file cleared while it was written is deleted instead), delete
        the oldest files past the budget, and only then call the batch done (flush waits for that)."""
        stale = []
        with self._cond:
            for item, size in written:
                if size is None:
                    continue
                if item.generation != self._generation:
                    stale.append(self.folder / file_name(item.digest))
                    continue
                self.index[item.digest] = size
                self.used += size
                self.stats.blocks_written += 1
                self.stats.bytes_written += size
            victims = self._over_budget()
        unlink_all(stale + victims, keep=self.folder)
        with self._cond:
            for item, _ in written:
                self._pending.discard(item.digest)
                self._pending_bytes -= item.payload.nbytes
            self._cond.notify_all()

    def _over_budget(self) -> list[Path]:
        """Drop the oldest files from the index until the folder fits the budget (others' files first);
        return their paths to delete (outside the lock). Called with the lock held."""
        victims = []
        while self.used > self.budget and (self.foreign or self.index):
            if self.foreign:
                path, size = self.foreign.popleft()
            else:
                digest, size = self.index.popitem(last=False)
                path = self.folder / file_name(digest)
            self.used -= size
            self.stats.files_evicted += 1
            victims.append(path)
        return victims

    # ---- measuring the disk --------------------------------------------------------------------------
    def probe_read_s(self) -> float | None:
        """Seconds to read and check one block file from the disk itself: PROBE_FILES block files
        written, synced, dropped from the page cache, then read back as a load reads them. None where
        the page cache cannot be dropped (the figure would be memory's, not the disk's)."""
        if not hasattr(os, "posix_fadvise"):
            return None
        payload = np.zeros(self.payload_bytes, dtype=np.uint8)
        tokens = tuple(range(self.block_size))
        digest = bytes(16)
        paths = [self.folder / f"probe-{os.getpid()}-{i}.probe" for i in range(PROBE_FILES)]
        try:
            for path in paths:
                write_block(path, digest, tokens, payload)
                drop_from_page_cache(path)
            seconds = []
            for path in paths:
                start = time.perf_counter()
                if read_block(path, digest, tokens, self.payload_bytes) is None:
                    return None
                seconds.append(time.perf_counter() - start)
        finally:
            unlink_all(paths, keep=self.folder)
        return sorted(seconds)[len(seconds) // 2]


def unlink_all(paths: list[Path], keep: Path | None = None) -> None:
    """Delete `paths` (any already gone is no error), then their folders but `keep` once empty (another
    model's folder whose last file went over the budget)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    for folder in {p.parent for p in paths} - {keep}:
        try:
            folder.rmdir()
        except OSError:  # not empty: files of its own model are still there
            pass
