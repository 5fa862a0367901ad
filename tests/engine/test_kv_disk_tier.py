"""The KV disk tier without a model: block files (name, checksum, torn and corrupted files), the store
(writer thread, budget, least recently used out first, other folders first, a restart's scan, clear),
the restore cost, and the block manager over a small pool: an evicted block is written and comes back
bit for bit, a corrupted or torn file is a miss that is computed instead, a slow disk is never read,
and a step that evicts nothing never touches the tier."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import torch

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.kv_block_file import block_digest, file_name, file_size, read_block, write_block
from llmopt.engine.kv_disk_store import KVDiskStore
from llmopt.engine.kv_disk_tier import KVDiskTier
from llmopt.engine.kv_restore_cost import RestoreCost
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence
from llmopt.engine.step_log import StepRecord

BS = 4  # tokens a block
LAYERS, HEADS, ROW = 2, 1, 4
PAYLOAD = LAYERS * 2 * BS * HEADS * ROW * 4  # fp32


def seq(tokens: list[int], name: str = "r") -> Sequence:
    return Sequence(name, tokens, SamplingParams(temperature=0), seed=0)


def computed(bm: BlockManager, pool: torch.Tensor, s: Sequence) -> None:
    """Pretend `s`'s whole prompt was computed: its KV is a function of each position's token."""
    for pos in range(s.num_computed_tokens, len(s)):
        pool[:, :, s.block_table[pos // BS], pos % BS] = s.token_ids[pos] + 0.5
    s.num_computed_tokens = len(s)
    bm.cache_full_blocks(s)


def tier_over(tmp_path, num_blocks: int, read_s: float = 1e-4, tokens_per_s: float = 1e4, budget_gb=1.0):
    pool = torch.zeros(LAYERS, 2, num_blocks, BS, HEADS, ROW)
    store = KVDiskStore(tmp_path, "model", budget_gb, BS, PAYLOAD)
    tier = KVDiskTier(store, pool, RestoreCost(BS, read_s, tokens_per_s))
    return BlockManager(num_blocks, BS, disk=tier), tier, pool


def evict_into_disk(bm: BlockManager, pool: torch.Tensor, tokens: list[int]) -> None:
    """Prefill `tokens`, free them, then fill the whole pool with other tokens, so that every block of
    theirs is evicted (and written)."""
    first = seq(tokens, "first")
    assert bm.admit(first, 64) is not None
    computed(bm, pool, first)
    bm.free(first)
    other = seq(list(range(1000, 1000 + bm.num_blocks * BS - 1)), "other")
    assert bm.admit(other, 10_000) is not None
    computed(bm, pool, other)
    bm.free(other)
    assert bm.disk.store.flush(10)


# ---- block files ------------------------------------------------------------------------------------
def test_a_blocks_name_is_a_stable_content_digest_chained_over_its_prefix():
    first = block_digest(None, (1, 2, 3, 4))
    assert first.hex() == "5c3887ef44b86da26265cb5c108a056b"  # the same in every process and version
    assert block_digest(first, (5, 6, 7, 8)) != block_digest(block_digest(None, (9, 2, 3, 4)), (5, 6, 7, 8))
    code = (
        "from llmopt.engine.kv_block_file import block_digest; print(block_digest(None, (1, 2, 3, 4)).hex())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == first.hex()


def test_a_block_file_reads_back_only_whole_and_as_its_block(tmp_path):
    payload = np.arange(PAYLOAD, dtype=np.uint8)
    digest, tokens = block_digest(None, (1, 2, 3, 4)), (1, 2, 3, 4)
    path = tmp_path / file_name(digest)
    assert write_block(path, digest, tokens, payload) == file_size(BS, PAYLOAD) == path.stat().st_size
    assert np.array_equal(read_block(path, digest, tokens, PAYLOAD), payload)
    assert read_block(path, digest, (1, 2, 3, 5), PAYLOAD) is None  # other tokens: no hit
    assert read_block(path, block_digest(None, (1, 2, 3, 5)), tokens, PAYLOAD) is None  # another name
    data = bytearray(path.read_bytes())
    data[200] ^= 0x01  # one bit of the payload flipped
    path.write_bytes(bytes(data))
    assert read_block(path, digest, tokens, PAYLOAD) is None
    write_block(path, digest, tokens, payload)
    with open(path, "r+b") as f:  # torn: the writer stopped halfway
        f.truncate(file_size(BS, PAYLOAD) // 2)
    assert read_block(path, digest, tokens, PAYLOAD) is None
    assert read_block(tmp_path / "missing.kv", digest, tokens, PAYLOAD) is None


# ---- the store ----------------------------------------------------------------------------------------
def put_blocks(store: KVDiskStore, count: int, start: int = 0) -> list[bytes]:
    digests = []
    for i in range(start, start + count):
        digest = block_digest(None, (i, i, i, i))
        assert store.put(digest, (i, i, i, i), np.full(PAYLOAD, i % 256, dtype=np.uint8))
        digests.append(digest)
    assert store.flush(10)
    return digests


def test_the_store_keeps_its_budget_least_recently_used_out_first(tmp_path):
    size = file_size(BS, PAYLOAD)
    store = KVDiskStore(tmp_path, "model", 3.5 * size / 2**30, BS, PAYLOAD)
    a, b, c = put_blocks(store, 3)
    assert store.read(a, (0, 0, 0, 0)) is not None  # a is used again: b is now the oldest
    [d] = put_blocks(store, 1, start=3)
    assert list(store.index) == [c, a, d] and store.used == 3 * size <= store.budget
    assert not (store.folder / file_name(b)).exists() and store.stats.files_evicted == 1
    assert store.hits([c, a, b, d]) == 2


def test_a_restart_finds_the_blocks_and_other_folders_go_first(tmp_path):
    size = file_size(BS, PAYLOAD)
    other = KVDiskStore(tmp_path, "other-model", 1.0, BS, PAYLOAD)
    [foreign] = put_blocks(other, 1, start=50)
    store = KVDiskStore(tmp_path, "model", 1.0, BS, PAYLOAD)
    digests = put_blocks(store, 3)
    again = KVDiskStore(tmp_path, "model", 3 * size / 2**30, BS, PAYLOAD)  # a restart with less room
    assert set(again.index) == set(digests) and again.hits(digests) == 3
    assert not (tmp_path / "other-model").exists()  # its only file went first, then its folder
    assert np.array_equal(again.read(digests[1], (1, 1, 1, 1)), np.full(PAYLOAD, 1, dtype=np.uint8))
    assert foreign not in again.index


def test_clear_deletes_every_block_and_drops_queued_writes(tmp_path):
    store = KVDiskStore(tmp_path, "model", 1.0, BS, PAYLOAD)
    digests = put_blocks(store, 2)
    assert store.clear() == 2 and store.hits(digests) == 0 and store.used == 0
    assert not list(store.folder.glob("*.kv"))
    put_blocks(store, 1, start=7)
    assert len(store.index) == 1  # the folder still takes writes


def test_a_full_writer_queue_drops_blocks_instead_of_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr("llmopt.engine.kv_disk_store.MAX_PENDING_BYTES", PAYLOAD)
    store = KVDiskStore(tmp_path, "model", 1.0, BS, PAYLOAD)
    monkeypatch.setattr(store, "_thread", object())  # a writer that never runs
    payload = np.zeros(PAYLOAD, dtype=np.uint8)
    assert store.put(block_digest(None, (1,)), (1,), payload)
    assert not store.put(block_digest(None, (2,)), (2,), payload)
    assert store.stats.writes_dropped == 1


def test_the_disk_is_probed_cold_at_start(tmp_path):
    store = KVDiskStore(tmp_path, "model", 1.0, BS, PAYLOAD)
    seconds = store.probe_read_s()
    assert seconds is not None and 0 < seconds < 1
    assert not list(store.folder.iterdir())  # its probe files are gone


# ---- the restore cost ----------------------------------------------------------------------------
def test_a_restore_happens_only_when_reading_is_measured_to_be_faster():
    cost = RestoreCost(16)
    assert not cost.worth_loading()  # nothing measured yet
    cost.observe_read(4, 0.004)  # 1 ms a block
    assert not cost.worth_loading()
    cost.observe_prefill(16, 0.001)  # one block: too short a step to time prefill by
    assert not cost.worth_loading()
    cost.observe_step(record(prefill_tokens=512, forward_s=1.0))  # 512 tok/s: 31 ms a block
    assert cost.worth_loading()
    cost.observe_step(record(prefill_tokens=64, forward_s=1.0))  # slower steps leave the fastest
    assert cost.prefill_tokens_per_s == 512
    cost.observe_read(1, 0.5)  # the disk slows down: 250 ms, averaged with the 1 ms before
    assert not cost.worth_loading()


def record(prefill_tokens: int, forward_s: float) -> StepRecord:
    return StepRecord(0.0, forward_s, forward_s, 0.0, 0.0, forward_s, prefill_tokens, 1, 0, 1, 1, 0)


def test_the_prefill_rate_a_run_measured_seeds_the_next(tmp_path):
    cost = RestoreCost(16, prefill_tokens_per_s=300.0)
    cost.save(tmp_path / "cost.json")
    later = RestoreCost(16, prefill_tokens_per_s=100.0)  # a cold warm-up's figure
    later.seed_from(tmp_path / "cost.json")
    assert later.prefill_tokens_per_s == 300.0
    other = RestoreCost(32)
    other.seed_from(tmp_path / "cost.json")  # another block size: not comparable
    assert other.prefill_tokens_per_s is None
    (tmp_path / "bad.json").write_text("[1, 2]")
    later.seed_from(tmp_path / "bad.json")


# ---- the block manager with a disk tier ------------------------------------------------------------------
def test_an_evicted_block_is_written_and_loaded_back_bit_for_bit(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 14))  # 3 full blocks and one token
    evict_into_disk(bm, pool, tokens)
    assert tier.store.hits(bm.digests(seq(tokens), 3)) == 3 and tier.stats.blocks_queued >= 3
    again = seq(tokens, "again")
    assert bm.admit(again, 64) == 1  # 12 tokens loaded, the last one computed
    assert again.num_computed_tokens == 12 and again.num_disk_cached_tokens == 12
    assert (bm.prefix_cache_hits, bm.prefix_cache_disk_hits) == (12, 12)
    for pos in range(12):
        assert torch.equal(
            pool[:, :, again.block_table[pos // BS], pos % BS], torch.full((2, 2, 1, 4), pos + 1.5)
        )
    # Loaded blocks are cached in RAM again: a third request takes them from there.
    computed(bm, pool, again)
    bm.free(again)
    third = seq(tokens, "third")
    assert bm.admit(third, 64) == 1 and third.num_disk_cached_tokens == 0
    assert bm.prefix_cache_disk_hits == 12


def test_a_corrupted_block_file_is_a_miss_and_is_computed(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 14))
    evict_into_disk(bm, pool, tokens)
    second = tier.store.folder / file_name(bm.digests(seq(tokens), 3)[1])
    data = bytearray(second.read_bytes())
    data[len(data) // 2] ^= 0xFF
    second.write_bytes(bytes(data))
    again = seq(tokens, "again")
    assert bm.admit(again, 64) == 9  # the first block loaded; the corrupted one and after computed
    assert again.num_computed_tokens == 4 and again.num_disk_cached_tokens == 4
    assert tier.stats.blocks_missed == 1 and not second.exists()
    assert bm.num_free_blocks == bm.num_blocks - len(again.block_table)  # nothing leaked


def test_a_disk_slower_than_prefill_is_never_read(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8, read_s=1.0, tokens_per_s=1000.0)
    tokens = list(range(1, 14))
    evict_into_disk(bm, pool, tokens)
    again = seq(tokens, "again")
    assert bm.admit(again, 64) == 13 and again.num_computed_tokens == 0
    assert tier.stats.blocks_skipped == 3 and tier.stats.blocks_read == 0


def test_prompt_logprobs_and_the_last_token_are_never_loaded(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 13))  # exactly 3 blocks: the third holds the last token
    evict_into_disk(bm, pool, tokens)
    scored = Sequence("scored", tokens, SamplingParams(temperature=0, prompt_logprobs=1), seed=0)
    assert bm.admit(scored, 64) == 12
    bm.free(scored)
    again = seq(tokens, "again")
    assert bm.admit(again, 64) == 4 and again.num_disk_cached_tokens == 8


def test_reset_prefix_cache_empties_the_disk_tier_too(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 14))
    evict_into_disk(bm, pool, tokens)
    bm.reset_prefix_cache()
    assert not tier.holds_blocks and not list(tier.store.folder.glob("*.kv"))
    assert bm.admit(seq(tokens, "again"), 64) == 13


def test_closing_writes_the_cached_blocks_a_restart_then_finds(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 14))
    first = seq(tokens, "first")
    bm.admit(first, 64)
    computed(bm, pool, first)
    bm.free(first)
    assert not tier.holds_blocks  # nothing evicted: nothing written yet
    tier.close(bm.cached_blocks())
    restarted, _, new_pool = tier_over(tmp_path, num_blocks=8)
    again = seq(tokens, "again")
    assert restarted.admit(again, 64) == 1 and again.num_disk_cached_tokens == 12
    assert torch.equal(new_pool[:, :, again.block_table[0], 0], torch.full((2, 2, 1, 4), 1.5))


class CountingTier(KVDiskTier):
    """The tier, counting what the block manager asks of it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def evicted(self, *args) -> None:
        self.calls += 1
        super().evicted(*args)

    def load(self, *args) -> int:
        self.calls += 1
        return super().load(*args)


def test_steps_that_evict_nothing_never_call_the_tier(tmp_path):
    pool = torch.zeros(LAYERS, 2, 16, BS, HEADS, ROW)
    tier = CountingTier(KVDiskStore(tmp_path, "model", 1.0, BS, PAYLOAD), pool, RestoreCost(BS, 1e-4, 1e4))
    bm = BlockManager(16, BS, disk=tier)
    s = seq(list(range(1, 10)), "decoding")
    bm.admit(s, 64)
    computed(bm, pool, s)
    for token in range(20):  # decode steps: new blocks come from never-used free blocks
        s.token_ids.append(token)
        assert bm.allocate(s, len(s))
        s.num_computed_tokens = len(s)
        bm.cache_full_blocks(s)
    assert tier.calls == 0 and not tier.holds_blocks
    assert os.listdir(tier.store.folder) == []


def test_a_load_never_takes_the_blocks_its_admission_needs(tmp_path):
    bm, tier, pool = tier_over(tmp_path, num_blocks=8)
    tokens = list(range(1, 21))  # 5 full blocks
    evict_into_disk(bm, pool, tokens + [0])
    holder = seq(list(range(500, 508)), "holder")  # holds 2 of the 8 blocks
    assert bm.admit(holder, 64) is not None
    again = seq(tokens + list(range(600, 608)), "again")  # 5 blocks on disk, 8 more tokens: 7 blocks
    assert bm.admit(again, 64) is None and tier.stats.blocks_read == 0  # 6 free: nothing loaded in vain
    assert bm.admit(again, 8) == 8  # a chunk of 8 fits beside 4 loaded blocks
    assert again.num_disk_cached_tokens == 16 and bm.num_free_blocks == 0
