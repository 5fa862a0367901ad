"""The scheduler alone, without a model: a fake step advances the sequences it scheduled as the engine
would (every scheduled token computed; a sequence whose prompt is done gains one token)."""

from __future__ import annotations

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch, Scheduler
from llmopt.engine.sequence import Sequence, SequenceStatus


def make(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8, budget: int = 32, caching=True):
    config = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    bm = BlockManager(num_blocks, block_size, caching)
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
