"""The KV disk tier as the block manager sees it: a second tier under the prefix cache of full blocks.

A cached block about to be handed out for other tokens (block_manager.py evicts it) is copied out of
the pool and queued for the store's writer thread (kv_disk_store.py) under its chained content digest
(kv_block_file.py); a prompt whose next blocks miss in RAM and are on disk gets them read back into
free pool blocks before its step, where RestoreCost (kv_restore_cost.py) has measured reading to be
faster than computing them. Nothing here runs in a step that evicts and restores nothing.

The pool is the runner's one tensor [layers, 2, blocks, block_size, kv heads, row] (model_runner.py):
a block is its index on the third axis, written to disk as [layers, 2, block_size, kv heads, row] in
the pool's dtype (fp32, bf16 or int8 rows with their scales: what the model computed, bit for bit).
"""

from __future__ import annotations

import atexit
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from llmopt.engine.config import EngineConfig
from llmopt.engine.kv_block_file import folder_name, model_identity
from llmopt.engine.kv_disk_store import GIB, KVDiskStore, tier_root
from llmopt.engine.kv_restore_cost import RestoreCost
from llmopt.engine.outputs import KVDiskStats

log = logging.getLogger(__name__)
COST_FILE = "restore_cost.json"  # the prefill rate measured, for the next start (the disk is probed anew)
# What a stop may spend writing the pool's cached blocks out (the server's engine thread is given 10 s
# to end): the most recently used first, so that what a restart finds is what was in use last.
SAVE_ON_CLOSE_S = 8.0


@dataclass
class TierStats:
    blocks_queued: int = 0  # copied out of the pool for the writer (the store counts what it wrote)
    bytes_queued: int = 0
    blocks_read: int = 0  # loaded into the pool
    bytes_read: int = 0
    read_s: float = 0.0
    blocks_missed: int = 0  # on disk but unreadable as the block: computed instead
    blocks_skipped: int = 0  # on disk, but computing them was measured to be faster


class KVDiskTier:
    def __init__(self, store: KVDiskStore, kv_cache: torch.Tensor, cost: RestoreCost):
        assert kv_cache.dim() == 6, "the pool is [layers, 2, blocks, block_size, kv heads, row]"
        self.store = store
        self.kv_cache = kv_cache
        self.cost = cost
        self.block_shape = block_shape(kv_cache)
        self.payload_bytes = payload_bytes(kv_cache)
        self.stats = TierStats()
        self.closed = False

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Path, kv_cache: torch.Tensor, compute_dtype: torch.dtype):
        """The tier of this model and pool under $LLMOPT_CACHE/kv; None when it is off (--kv-disk-gb 0 or
        no prefix caching) or its folder cannot be used (then said once in the log)."""
        if not config.enable_prefix_caching or config.kv_disk_gb == 0:
            return None
        parts = {
            "compute_dtype": str(compute_dtype),
            "kv_dtype": str(kv_cache.dtype),
            "kv_cache_dtype": config.kv_cache_dtype,
            "block": list(block_shape(kv_cache)),
        }
        try:
            folder = folder_name(model_identity(checkpoint), parts)
            payload = payload_bytes(kv_cache)
            store = KVDiskStore(tier_root(), folder, config.kv_disk_gb, config.block_size, payload)
            cost = RestoreCost(config.block_size, store.probe_read_s())
        except OSError as exc:
            log.warning("KV disk tier off: its folder under %s cannot be used (%s)", tier_root(), exc)
            return None
        cost.seed_from(store.folder / COST_FILE)
        tier = cls(store, kv_cache, cost)
        log.info(
            "KV disk tier: %s, %.1f of %.1f GiB used, %d blocks of this model; a block read cold in %s",
            store.folder,
            store.used / GIB,
            store.budget / GIB,
            len(store.index),
            "-" if cost.read_s_per_block is None else f"{cost.read_s_per_block * 1e3:.2f} ms",
        )
        return tier

    def evicted(self, block_id: int, digest: bytes, token_ids: tuple[int, ...]) -> None:
        """A cached block is about to be overwritten: copy it out for writing (unless it is on disk)."""
        if digest in self.store:
            return
        if self.store.put(digest, token_ids, self.copy_out(block_id)):
            self.stats.blocks_queued += 1
            self.stats.bytes_queued += self.payload_bytes

    def copy_out(self, block_id: int) -> np.ndarray:
        """Block `block_id`'s values at every layer, copied out of the pool as the bytes a file holds."""
        return self.kv_cache[:, :, block_id].clone().view(torch.uint8).reshape(-1).numpy()

    @property
    def holds_blocks(self) -> bool:
        return bool(self.store.index)

    def hits(self, digests: list[bytes]) -> int:
        """How many of `digests`, from the first, are on disk."""
        return self.store.hits(digests)

    def worth_loading(self, num_blocks: int) -> bool:
        """Reading is measured to be cheaper than computing; counts the blocks passed over when not."""
        if self.cost.worth_loading():
            return True
        self.stats.blocks_skipped += num_blocks
        return False

    def load(self, block_ids: list[int], digests: list[bytes], token_ids: list[tuple[int, ...]]) -> int:
        """Read blocks into the pool's `block_ids`, in order, up to the first that does not read as its
        block; return how many were loaded (the rest are computed)."""
        start = time.perf_counter()
        loaded = 0
        try:
            for block_id, digest, tokens in zip(block_ids, digests, token_ids):
                payload = self.store.read(digest, tokens)
                if payload is None:
                    self.stats.blocks_missed += 1
                    break
                values = torch.from_numpy(payload).view(self.kv_cache.dtype).view(self.block_shape)
                self.kv_cache[:, :, block_id].copy_(values)
                loaded += 1
        except Exception:  # whatever went wrong, those blocks are computed: a miss, never a failed step
            log.exception("KV disk tier: a block could not be loaded; it is computed instead")
        seconds = time.perf_counter() - start
        self.cost.observe_read(loaded, seconds)
        self.stats.blocks_read += loaded
        self.stats.bytes_read += loaded * self.payload_bytes
        self.stats.read_s += seconds
        return loaded

    def clear(self) -> int:
        return self.store.clear()

    def snapshot(self) -> KVDiskStats:
        t, s, store = self.stats, self.store.stats, self.store
        return KVDiskStats(
            blocks=len(store.index),
            bytes_used=store.used,
            budget_bytes=store.budget,
            blocks_queued=t.blocks_queued,
            blocks_written=s.blocks_written,
            bytes_written=s.bytes_written,
            writes_dropped=s.writes_dropped,
            write_errors=s.write_errors,
            blocks_read=t.blocks_read,
            bytes_read=t.bytes_read,
            read_s=t.read_s,
            blocks_missed=t.blocks_missed,
            blocks_skipped=t.blocks_skipped,
            files_evicted=s.files_evicted,
            read_s_per_block=self.cost.read_s_per_block,
            prefill_s_per_block=self.cost.prefill_s_per_block(),
        )

    def close(self, cached: list[tuple[int, bytes, tuple[int, ...]]]) -> None:
        """Write out the pool's cached blocks not yet on disk (`cached`: most recently used first), for
        at most SAVE_ON_CLOSE_S, and the prefill rate measured; the engine reads no block after this."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + SAVE_ON_CLOSE_S
        for block_id, digest, tokens in cached:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if digest not in self.store:
                self.store.put(digest, tokens, self.copy_out(block_id), wait_s=remaining)
        self.store.flush(max(0.0, deadline - time.monotonic()))
        try:
            self.cost.save(self.store.folder / COST_FILE)
        except OSError:
            pass


def block_shape(kv_cache: torch.Tensor) -> tuple[int, ...]:
    """One block of the pool [layers, 2, blocks, block_size, kv heads, row]: [layers, 2, block_size, ...]."""
    return (*kv_cache.shape[:2], *kv_cache.shape[3:])


def payload_bytes(kv_cache: torch.Tensor) -> int:
    return math.prod(block_shape(kv_cache)) * kv_cache.dtype.itemsize


def close_at_exit(close) -> None:
    """Call `close` (a weak method of an in-process LLM's engine) when the interpreter exits, if it is
    still alive: an LLM is seldom closed by hand, and its cached blocks are what a next run would find.
    Never for a server's engine, whose thread may still be stepping then: its thread closes it."""

    def at_exit() -> None:
        method = close()
        if method is not None:
            method()

    atexit.register(at_exit)
