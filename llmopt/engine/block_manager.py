from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from llmopt.engine.kv_block_file import block_digest
from llmopt.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from llmopt.engine.kv_disk_tier import KVDiskTier


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (a partly filled last block counts)."""
    return -(-num_tokens // block_size)


def block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    # Chained: a block's hash covers every token before it, so equal hashes mean equal prefixes
    # (a hit is still confirmed by comparing token ids, in case of a collision).
    return hash((parent_hash, token_ids))


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "digest")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()
        self.digest: bytes | None = None  # its name on disk (kv_block_file.py), with a disk tier only


class BlockManager:
    """Paged KV blocks with ref counts and a prefix cache of full blocks.

    Free blocks sit in LRU order: blocks without cached content first, then cached blocks from the
    least recently freed. A freed block keeps its hash until it is handed out again, so a later request
    with the same prefix can take it back.

    In-flight prefix sharing: an admitted sequence claims the full prompt blocks it is about to compute
    (`computing`: hash -> that sequence) until each is complete and cached. A waiting sequence whose next
    block is claimed by another waits (`waits_for_inflight`) and then takes it from the cache, so four
    requests arriving together with one system prompt compute it once, however many chunks it takes.
    Freeing the claimer (finish, abort, preemption) drops its claims: the waiters then compute the rest.

    With a disk tier (kv_disk_tier.py), a cached block is handed to it when evicted (written out in the
    background), and an admitted sequence whose prompt goes on past its RAM hits with blocks on disk
    gets them loaded into free blocks, where reading is measured to be faster than computing them.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        inflight_prefix_sharing: bool = True,
        disk: KVDiskTier | None = None,
    ):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.disk = disk if enable_prefix_caching else None
        self.inflight_prefix_sharing = enable_prefix_caching and inflight_prefix_sharing
        self.computing: dict[int, Sequence] = {}  # claimed prompt blocks not yet computed, by hash
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up by admitted sequences
        self.prefix_cache_hits = 0  # of those, tokens served from the cache (either tier)
        self.prefix_cache_disk_hits = 0  # of those, tokens loaded from the disk tier

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks to add to `seq` so that its first `num_tokens` tokens have KV slots."""
        return max(0, num_blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def take_cached_prefix(self, seq: Sequence) -> int:
        """Give a new sequence the cached blocks of its longest cached prefix; return the tokens covered.

        The last prompt token is never taken from the cache: its logits are needed to sample. Nor is any
        prompt token of a request that asks for prompt logprobs and has not had them yet.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching or seq.needs_prompt_logits:
            return 0
        bs = self.block_size
        for i, h in enumerate(self.hashes(seq, (len(seq) - 1) // bs)):
            block_id = self.hash_to_block_id.get(h)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
        seq.num_computed_tokens = len(seq.block_table) * bs
        return seq.num_computed_tokens

    def hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of `seq`'s first `num_blocks` full blocks, memoized on the sequence."""
        bs = self.block_size
        assert num_blocks * bs <= len(seq)
        memo = seq.prefix_hashes
        del memo[len(seq) // bs :]  # blocks past a cut (tokens after a stop are dropped)
        parent = memo[-1] if memo else None
        for i in range(len(memo), num_blocks):
            parent = block_hash(parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))
            memo.append(parent)
        return memo[:num_blocks]

    def digests(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The disk tier's names of `seq`'s first `num_blocks` full blocks (kv_block_file.block_digest:
        stable across processes, unlike `hashes`), memoized on the sequence."""
        bs = self.block_size
        assert num_blocks * bs <= len(seq)
        memo = seq.prefix_digests
        del memo[len(seq) // bs :]
        parent = memo[-1] if memo else None
        for i in range(len(memo), num_blocks):
            parent = block_digest(parent, seq.token_ids[i * bs : (i + 1) * bs])
            memo.append(parent)
        return memo[:num_blocks]

    def waits_for_inflight(self, seq: Sequence) -> bool:
        """True when the first block of `seq`'s prompt missing from the cache is claimed by another
        sequence: admitted now, `seq` would compute that block a second time. Cheap when nothing is
        claimed (the common case); otherwise dictionary lookups down its memoized hashes."""
        if not self.computing or seq.needs_prompt_logits:
            return False
        for h in self.hashes(seq, (len(seq) - 1) // self.block_size):
            if h in self.hash_to_block_id:  # computed already (confirmed by token ids when taken)
                continue
            owner = self.computing.get(h)
            if owner is None or owner is seq:
                return False
            # The claimer runs and holds blocks, so its prefill goes on; a claim outlives neither.
            assert owner.status == SequenceStatus.RUNNING and owner.block_table, "a stale claim"
            return True
        return False

    def claim(self, seq: Sequence) -> None:
        """Register the full blocks `seq` computes from here on as being computed by it (those not cached
        and not claimed already), so that waiting sequences with the same prefix wait for them."""
        if not self.inflight_prefix_sharing:
            return
        first = seq.num_computed_tokens // self.block_size
        for h in self.hashes(seq, len(seq) // self.block_size)[first:]:
            if h not in self.hash_to_block_id:
                self.computing.setdefault(h, seq)

    def admit(self, seq: Sequence, max_new_tokens: int) -> int | None:
        """Give a waiting sequence its longest cached prefix and blocks for up to `max_new_tokens` more of
        its tokens; return how many tokens it computes now. None when the free blocks are too few: then
        it holds nothing (its cached blocks go back) and the prefix-cache counters are unchanged."""
        cached = self.take_cached_prefix(seq)
        from_disk = self.load_from_disk(seq, max_new_tokens) if self.disk is not None else 0
        num_new = min(len(seq) - seq.num_computed_tokens, max_new_tokens)
        if not self.allocate(seq, seq.num_computed_tokens + num_new):
            self.free(seq)
            return None
        self.claim(seq)
        if not seq.needs_prompt_logits:  # that one never looks the cache up
            self.prefix_cache_queries += len(seq)
            self.prefix_cache_hits += cached + from_disk
            self.prefix_cache_disk_hits += from_disk
        if seq.num_preemptions == 0:
            seq.num_disk_cached_tokens = from_disk
        return num_new

    def load_from_disk(self, seq: Sequence, max_new_tokens: int) -> int:
        """Load the blocks of `seq`'s prompt that follow its RAM hits from the disk tier, as far as they
        are there, read whole and are cheaper to read than to compute; return the tokens loaded. Free
        blocks enough for the chunk after them are left (a load that starved the sequence's own
        admission would be evicted again before it was used)."""
        assert self.disk is not None
        bs, first = self.block_size, len(seq.block_table)
        last = (len(seq) - 1) // bs  # the last prompt token is computed, never loaded (its logits)
        if first >= last or seq.needs_prompt_logits or not self.disk.holds_blocks:
            return 0
        digests = self.digests(seq, last)[first:]
        count, free = self.disk.hits(digests), self.num_free_blocks
        # Fewer, while the loaded blocks and the chunk computed after them would not fit the free blocks.
        while (
            count and num_blocks_for(min(len(seq), (first + count) * bs + max_new_tokens), bs) > first + free
        ):
            count -= 1
        if count == 0 or not self.disk.worth_loading(count):
            return 0
        block_ids = [self.take_free_block() for _ in range(count)]
        tokens = [tuple(seq.token_ids[i * bs : (i + 1) * bs]) for i in range(first, first + count)]
        loaded = self.disk.load(block_ids, digests[:count], tokens)
        hashes = self.hashes(seq, first + loaded)
        for k, block_id in enumerate(block_ids):
            block = self.blocks[block_id]
            if k >= loaded:  # not loaded: back to the head of the free list, holding nothing
                block.ref_count = 0
                self.free_block_ids[block_id] = None
                self.free_block_ids.move_to_end(block_id, last=False)
                continue
            h = hashes[first + k]
            block.hash, block.token_ids, block.digest = h, tokens[k], digests[k]
            self.hash_to_block_id[h] = block_id
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
        seq.num_computed_tokens = len(seq.block_table) * bs
        return loaded * bs

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Add fresh blocks so that `seq` has slots for `num_tokens` tokens; False (and nothing added)
        when too few blocks are free."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            seq.block_table.append(self.take_free_block())
        return True

    def take_free_block(self) -> int:
        """The least recently freed block, its cached content evicted (to the disk tier, if any), held
        once."""
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None:  # evict its cached content
            if self.hash_to_block_id.get(block.hash) == block_id:
                del self.hash_to_block_id[block.hash]
            if block.digest is not None and self.disk is not None:
                self.disk.evicted(block_id, block.digest, block.token_ids)
            block.hash, block.token_ids, block.digest = None, (), None
        block.ref_count = 1
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that `seq` has completely computed, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        if num_full <= len(seq.block_hashes):  # most decode steps: no block completed
            return
        hashes = self.hashes(seq, num_full)
        digests = self.digests(seq, num_full) if self.disk is not None else None
        for i in range(len(seq.block_hashes), num_full):
            h = hashes[i]
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tuple(seq.token_ids[i * bs : (i + 1) * bs])
                block.digest = digests[i] if digests is not None else None
                self.hash_to_block_id[h] = block.block_id
            assert block.hash == h, "a shared block's content must match the sequence's tokens"
            if self.computing.get(h) is seq:  # complete: its waiters take it from the cache now
                del self.computing[h]
            seq.block_hashes.append(h)

    def reset_prefix_cache(self) -> int:
        """Forget the cached content of every free block (blocks in use keep theirs: their sequences still
        read them), and every block of the disk tier; return how many were forgotten in RAM. What
        benchmarks call between points, so that no point is served from what an earlier one left."""
        forgotten = 0
        for block_id in self.free_block_ids:
            block = self.blocks[block_id]
            if block.hash is not None:
                if self.hash_to_block_id.get(block.hash) == block_id:
                    del self.hash_to_block_id[block.hash]
                block.hash, block.token_ids, block.digest = None, (), None
                forgotten += 1
        if self.disk is not None:
            self.disk.clear()
        return forgotten

    def cached_blocks(self) -> list[tuple[int, bytes, tuple[int, ...]]]:
        """(block, disk name, tokens) of every cached block, most recently used first: blocks in use,
        then free ones from the most recently freed (what a stop writes to the disk tier)."""
        free = set(self.free_block_ids)
        order = [b for b in self.blocks if b.block_id not in free]
        order += [self.blocks[i] for i in reversed(self.free_block_ids)]
        return [
            (b.block_id, b.digest, b.token_ids) for b in order if b.hash is not None and b.digest is not None
        ]

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; blocks nobody holds go back to the free list."""
        # Tail blocks first, so that a prefix's later blocks are evicted before its earlier ones.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                if block.hash is None:  # nothing worth keeping: hand it out before cached blocks
                    self.free_block_ids.move_to_end(block_id, last=False)
        if self.computing:  # its unfinished claims go: waiters compute those blocks themselves
            for h in seq.prefix_hashes:
                if self.computing.get(h) is seq:
                    del self.computing[h]
            assert all(owner is not seq for owner in self.computing.values()), "a claim outlived its seq"
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
