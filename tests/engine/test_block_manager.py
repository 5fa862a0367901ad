from llmopt.engine.block_manager import BlockManager, block_hash
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence


def seq(tokens: list[int], name: str = "r") -> Sequence:
    return Sequence(name, tokens, SamplingParams(temperature=0), seed=0)


def run_prefill(bm: BlockManager, s: Sequence) -> int:
    """Admit `s` as the scheduler does and pretend its whole prompt was computed."""
    cached = bm.take_cached_prefix(s)
    bm.allocate(s, len(s))
    s.num_computed_tokens = len(s)
    bm.cache_full_blocks(s)
    return cached


def test_hash_chain_depends_on_the_whole_prefix():
    a = block_hash(None, (1, 2, 3, 4))
    assert block_hash(a, (5, 6, 7, 8)) != block_hash(block_hash(None, (9, 2, 3, 4)), (5, 6, 7, 8))
    assert block_hash(a, (5, 6, 7, 8)) == block_hash(block_hash(None, (1, 2, 3, 4)), (5, 6, 7, 8))


def test_shared_prefix_is_reused_and_ref_counted():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = seq(list(range(10)), "a")
    assert run_prefill(bm, first) == 0
    assert len(first.block_table) == 3 and len(first.block_hashes) == 2  # 2 full blocks cached

    second = seq(list(range(8)) + [99, 98, 97], "b")
    assert run_prefill(bm, second) == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert [bm.blocks[b].ref_count for b in first.block_table[:2]] == [2, 2]

    bm.free(first)
    assert [bm.blocks[b].ref_count for b in second.block_table[:2]] == [1, 1]
    bm.free(second)
    assert bm.num_free_blocks == bm.num_blocks


def test_last_prompt_token_is_never_taken_from_the_cache():
    bm = BlockManager(num_blocks=10, block_size=4)
    run_prefill(bm, seq(list(range(8)), "a"))
    again = seq(list(range(8)), "b")
    # Both blocks are cached, but the last token's logits are needed: only the first block is taken.
    assert bm.take_cached_prefix(again) == 4


def test_freed_blocks_keep_their_content_and_are_reused_lru():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(list(range(9)), "a")  # 2 full blocks + 1 partial
    run_prefill(bm, a)
    cached_blocks = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 6
    # The partial (unhashed) block is handed out before any cached block.
    b = seq([50, 51, 52], "b")
    run_prefill(bm, b)
    assert b.block_table[0] not in cached_blocks
    # A later request with the same prefix still finds the freed blocks.
    c = seq(list(range(8)) + [7, 7], "c")
    assert run_prefill(bm, c) == 8 and c.block_table[:2] == cached_blocks
    bm.free(b)
    bm.free(c)

    # A request that needs every block evicts the cached ones: their content is gone.
    d = seq(list(range(100, 124)), "d")
    run_prefill(bm, d)
    assert bm.blocks[cached_blocks[0]].token_ids != tuple(range(4))
    bm.free(d)
    assert bm.num_free_blocks == bm.num_blocks
    assert bm.take_cached_prefix(seq(list(range(8)) + [1], "e")) == 0


def test_eviction_order_prefers_tail_blocks_of_a_prefix():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5, 6, 7], "a")  # 3 full blocks cached, 1 partial
    run_prefill(bm, a)
    head, middle, tail = a.block_table[:3]
    bm.free(a)
    b = seq([9, 9, 9], "b")  # needs 2 blocks: the partial one, then the prefix's tail block
    run_prefill(bm, b)
    assert tail in b.block_table and head not in b.block_table and middle not in b.block_table
    bm.free(b)
    c = seq([1, 2, 3, 4, 0], "c")
    assert run_prefill(bm, c) == 4  # head and middle survived


def test_hit_is_confirmed_by_token_ids():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3], "a")
    run_prefill(bm, a)
    # Forge a collision: point the hash of a different block content at a's first block.
    fake = block_hash(None, (7, 8))
    bm.hash_to_block_id[fake] = a.block_table[0]
    b = seq([7, 8, 9], "b")
    assert bm.take_cached_prefix(b) == 0


def test_prefix_caching_off_never_shares():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a, b = seq([1, 2, 3, 4, 5], "a"), seq([1, 2, 3, 4, 5], "b")
    assert run_prefill(bm, a) == 0 and run_prefill(bm, b) == 0
    assert not set(a.block_table) & set(b.block_table)
    assert not bm.hash_to_block_id


def test_allocation_beyond_the_free_blocks_is_refused_and_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    s = seq(list(range(6)))
    assert bm.allocate(s, 6) and len(s.block_table) == 2
    assert not bm.allocate(s, 13)  # needs 2 more, 1 is free
    assert len(s.block_table) == 2 and bm.num_free_blocks == 1


def test_admission_that_does_not_fit_gives_the_cached_prefix_back():
    bm = BlockManager(num_blocks=3, block_size=4)
    first = seq(list(range(9)), "a")
    assert bm.admit(first, max_new_tokens=64) == 9
    first.num_computed_tokens = 9
    bm.cache_full_blocks(first)
    bm.free(first)
    again = seq(list(range(8)) + list(range(100, 120)), "b")  # shares 2 blocks, needs 7 in all
    assert bm.admit(again, max_new_tokens=64) is None
    assert again.block_table == [] and again.num_computed_tokens == 0
    assert bm.num_free_blocks == 3 and (bm.prefix_cache_queries, bm.prefix_cache_hits) == (9, 0)
    assert bm.admit(again, max_new_tokens=4) == 4  # a chunk fits: the cached 8 tokens are hits
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (9 + 28, 8)


def test_reset_prefix_cache_forgets_free_blocks_and_keeps_those_in_use():
    bm = BlockManager(num_blocks=6, block_size=4)
    done, running = seq(list(range(9)), "done"), seq(list(range(100, 109)), "running")
    run_prefill(bm, done)
    run_prefill(bm, running)
    bm.free(done)
    assert bm.reset_prefix_cache() == 2  # done's two full blocks
    assert bm.take_cached_prefix(seq(list(range(9)), "again")) == 0
    assert bm.take_cached_prefix(seq(list(range(100, 109)), "shares")) == 8  # still held: still shared
