"""The scheduler alone, without a model: a fake step advances the sequences it scheduled as the engine
would (every scheduled token computed; a sequence whose prompt is done gains one token)."""

from __future__ import annotations

import random

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch, Scheduler
from llmopt.engine.sequence import Sequence, SequenceStatus


def make(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    budget: int = 32,
    caching=True,
    sharing=True,
):
    config = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        inflight_prefix_sharing=sharing,
    )
    bm = BlockManager(num_blocks, block_size, caching, sharing)
    return Scheduler(config, bm), bm


def seq(n: int, name: str, first: int = 0) -> Sequence:
    return Sequence(name, list(range(first, first + n)), SamplingParams(temperature=0, max_tokens=64), seed=0)


def fake_step(scheduler: Scheduler, bm: BlockManager) -> ScheduledBatch:
    batch = scheduler.schedule()
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        if s.num_computed_tokens == len(s):
            s.token_ids.append(1000 + len(s))
        bm.cache_full_blocks(s)
    return batch


def test_decodes_come_first_and_the_budget_caps_the_step():
    scheduler, bm = make(budget=10)
    a = seq(6, "a")
    scheduler.add(a)
    assert fake_step(scheduler, bm).num_new_tokens == [6]
    b, c = seq(8, "b", 100), seq(8, "c", 200)
    scheduler.add(b)
    scheduler.add(c)
    batch = fake_step(scheduler, bm)
    # a decodes one token, b prefills its 8, and c gets the one token left of the budget (a chunk).
    assert [s.request_id for s in batch.seqs] == ["a", "b", "c"] and batch.num_new_tokens == [1, 8, 1]
    batch = fake_step(scheduler, bm)
    assert [s.request_id for s in batch.seqs] == ["a", "b", "c"] and batch.num_new_tokens == [1, 1, 7]


def test_a_long_prompt_is_prefilled_in_chunks():
    scheduler, bm = make(budget=8)
    long = seq(20, "long")
    scheduler.add(long)
    chunks = [fake_step(scheduler, bm).num_new_tokens for _ in range(3)]
    assert chunks == [[8], [8], [4]]
    assert long.num_computed_tokens == 20 and len(long) == 21  # the last chunk sampled a token


def test_max_num_seqs_caps_the_running_batch():
    scheduler, bm = make(max_num_seqs=2)
    for i in range(3):
        scheduler.add(seq(4, f"s{i}", 10 * i))
    fake_step(scheduler, bm)
    assert len(scheduler.running) == 2 and len(scheduler.waiting) == 1


def test_the_newest_sequence_is_preempted_when_blocks_run_out():
    scheduler, bm = make(num_blocks=4, block_size=4, budget=64)
    old, new = seq(7, "old"), seq(7, "new", 100)
    scheduler.add(old)
    scheduler.add(new)
    fake_step(scheduler, bm)  # each holds 2 blocks: the pool is full
    assert bm.num_free_blocks == 0
    fake_step(scheduler, bm)  # old reaches 8 tokens, then 9 needs a third block
    batch = fake_step(scheduler, bm)
    assert [s.request_id for s in batch.seqs] == ["old"]
    assert new.status == SequenceStatus.WAITING and scheduler.waiting[0] is new
    assert new.block_table == [] and new.num_computed_tokens == 0 and new.num_preemptions == 1
    assert scheduler.num_preemptions == 1


def test_admission_that_cannot_get_blocks_holds_nothing_and_counts_nothing():
    scheduler, bm = make(num_blocks=3, block_size=4)
    first = seq(9, "first")
    scheduler.add(first)
    fake_step(scheduler, bm)  # 9 prompt tokens + 1: 3 blocks, 2 of them full and cached
    scheduler.finish(first, "stop")
    assert bm.num_free_blocks == 3
    scheduler.add(seq(9, "shares", 0))
    fake_step(scheduler, bm)
    queries, hits = bm.prefix_cache_queries, bm.prefix_cache_hits
    assert hits == 8  # the second request found the first two blocks
    big = seq(30, "big", 500)
    scheduler.add(big)
    assert fake_step(scheduler, bm).seqs[0].request_id == "shares"  # big does not fit
    assert big.block_table == [] and list(scheduler.waiting) == [big]
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (queries, hits)


def test_finish_frees_blocks_from_either_queue():
    scheduler, bm = make()
    running, waiting = seq(5, "running"), seq(5, "waiting", 50)
    scheduler.add(running)
    fake_step(scheduler, bm)
    scheduler.add(waiting)
    scheduler.finish(running, "abort")
    scheduler.finish(waiting, "abort")
    assert not scheduler.running and not scheduler.waiting
    assert bm.num_free_blocks == bm.num_blocks
    assert running.finish_reason == waiting.finish_reason == "abort"


# ---- in-flight prefix sharing ------------------------------------------------------------------------
PREFIX = list(range(500, 540))  # 10 blocks of 4: a system prompt every request starts with


def shared_prefix_requests(n: int = 4) -> list[Sequence]:
    """`n` requests arriving together: the 10-block prefix, then 2 tokens of their own, 3 to generate."""
    params = SamplingParams(temperature=0, max_tokens=3)
    return [Sequence(f"r{i}", PREFIX + [900 + i, 950 + i], params, seed=0) for i in range(n)]


def run_to_end(scheduler: Scheduler, bm: BlockManager, steps: int = 100) -> int:
    """Step (as fake_step) until every request has its 3 tokens; return the prompt tokens computed."""
    computed = 0
    for _ in range(steps):
        if not scheduler.running and not scheduler.waiting:
            return computed
        batch = scheduler.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            computed += max(0, min(s.num_computed_tokens + n, s.num_prompt_tokens) - s.num_computed_tokens)
            s.num_computed_tokens += n
            if s.num_computed_tokens == len(s):
                s.token_ids.append(1000 + len(s))
            bm.cache_full_blocks(s)
            if s.num_output_tokens == s.params.max_tokens:
                scheduler.finish(s, "stop")
    raise AssertionError(f"not done after {steps} steps: {len(scheduler.waiting)} still waiting")


def assert_nothing_held(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    assert not bm.computing


def test_a_prefix_being_computed_is_computed_once():
    """The budget (16) cuts the 42-token prompts into chunks: with sharing, the first request computes
    the prefix in three steps while the other three wait, then each computes only its own 2 tokens."""
    counts = {}
    for sharing in (True, False):
        scheduler, bm = make(budget=16, sharing=sharing)
        requests = shared_prefix_requests()
        for r in requests:
            scheduler.add(r)
        counts[sharing] = run_to_end(scheduler, bm)
        assert all(r.finish_reason == "stop" and r.num_output_tokens == 3 for r in requests)
        assert_nothing_held(bm)
        if sharing:  # the waiters' prefix came from the first request's computation: hits, all of it
            assert [r.num_cached_tokens for r in requests] == [0, 40, 40, 40]
            assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (4 * 42, 3 * 40)
    assert counts[True] == 42 + 3 * 2
    assert counts[False] > counts[True]  # without it, a waiter admitted mid-prefix computes it again


def test_waiters_take_each_chunk_only_once_it_is_complete():
    scheduler, bm = make(budget=16)
    first, *waiters = shared_prefix_requests()
    for r in (first, *waiters):
        scheduler.add(r)
    for computed in (16, 32, 42):  # the first request's chunks; the budget left over stays unused
        batch = fake_step(scheduler, bm)
        assert batch.seqs == [first] and first.num_computed_tokens == computed
        assert len(bm.computing) == 10 - computed // 4  # a complete block's claim is released
        assert list(scheduler.waiting) == waiters and all(not w.block_table for w in waiters)
    batch = fake_step(scheduler, bm)  # the prefix is complete: the waiters join, 2 tokens each
    assert batch.seqs == [first, *waiters] and batch.num_new_tokens == [1, 2, 2, 2]


def test_an_unrelated_request_is_not_held_up_by_waiters():
    scheduler, bm = make(budget=16)
    first, waiter = shared_prefix_requests(2)
    other = seq(6, "other", 300)
    for r in (first, waiter, other):
        scheduler.add(r)
    fake_step(scheduler, bm)  # first takes the whole budget
    fake_step(scheduler, bm)
    batch = fake_step(scheduler, bm)  # first's last 10 tokens; the 6 left go to `other`, past the waiter
    assert batch.seqs == [first, other] and list(scheduler.waiting) == [waiter]


def test_aborting_the_request_computing_the_prefix_leaves_no_waiter_stuck():
    scheduler, bm = make(budget=16)
    first, *waiters = shared_prefix_requests()
    for r in (first, *waiters):
        scheduler.add(r)
    fake_step(scheduler, bm)
    fake_step(scheduler, bm)  # 32 of the 40 prefix tokens computed: 8 blocks cached, 2 claimed
    assert bm.computing
    scheduler.finish(first, "abort")
    assert not bm.computing  # its claims went with it
    computed = run_to_end(scheduler, bm)
    # The next request takes the 8 finished blocks and computes the rest; the last two wait for it.
    assert computed == (42 - 32) + 2 * 2
    assert [w.num_cached_tokens for w in waiters] == [32, 40, 40]
    assert all(w.finish_reason == "stop" and w.num_output_tokens == 3 for w in waiters)
    assert_nothing_held(bm)


def test_a_preempted_prefix_owner_resumes_and_its_waiters_follow():
    scheduler, bm = make(budget=16)
    first, *waiters = shared_prefix_requests()
    for r in (first, *waiters):
        scheduler.add(r)
    fake_step(scheduler, bm)
    scheduler.preempt(first)
    assert not bm.computing and scheduler.waiting[0] is first
    run_to_end(scheduler, bm)
    assert all(r.finish_reason == "stop" for r in (first, *waiters))
    assert [w.num_cached_tokens for w in waiters] == [40, 40, 40]
    assert_nothing_held(bm)


def test_sharing_off_or_caching_off_claims_nothing():
    for caching, sharing in ((True, False), (False, True)):
        scheduler, bm = make(budget=16, caching=caching, sharing=sharing)
        for r in shared_prefix_requests():
            scheduler.add(r)
        fake_step(scheduler, bm)
        assert not bm.computing
        run_to_end(scheduler, bm)
        assert_nothing_held(bm)


def random_run(seed: int) -> int:
    """30 requests on 3 shared prefixes into a small pool, some aborted midway; return the preemptions."""
    rng = random.Random(seed)
    num_blocks, budget, max_seqs = rng.choice([12, 20, 40]), rng.choice([4, 8, 16, 33]), rng.choice([2, 4, 8])
    scheduler, bm = make(num_blocks=num_blocks, max_num_seqs=max_seqs, budget=budget)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(3)]
    requests: list[Sequence] = []
    for _ in range(3000):
        if len(requests) < 30 and rng.random() < 0.3:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(6))]
            params = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 8))
            requests.append(Sequence(f"r{len(requests)}", prompt[: num_blocks * 4 - 10], params, seed=0))
            scheduler.add(requests[-1])
        live = [r for r in requests if r.status != SequenceStatus.FINISHED]
        if live and rng.random() < 0.05:
            scheduler.finish(rng.choice(live), "abort")
        batch = scheduler.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += n
            if s.num_computed_tokens == len(s):
                s.token_ids.append(rng.randrange(50))
            bm.cache_full_blocks(s)
            if s.num_output_tokens >= s.params.max_tokens:
                scheduler.finish(s, "stop")
        if len(requests) == 30 and not scheduler.running and not scheduler.waiting:
            assert_nothing_held(bm)
            return scheduler.num_preemptions
    raise AssertionError(f"seed {seed}: {len(scheduler.waiting)} waiting, {len(scheduler.running)} running")


def test_random_arrivals_aborts_and_preemptions_strand_nothing():
    assert sum(random_run(seed) for seed in range(40)) > 0  # preemptions happened, claims with them
