from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: sequences (single-token ones first) and how many new tokens each computes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    """Continuous batching under a sequence cap and a per-step token budget.

    Each step: running sequences first (decodes, then the next chunk of unfinished prefills), then
    waiting sequences in arrival order while budget, sequence slots and KV blocks last. When a running
    sequence needs a block and none is free, the newest running sequence is preempted by recompute:
    its blocks are freed (cached ones keep their content) and it goes back to the head of the queue.
    A waiting sequence whose next prompt blocks another sequence is computing right now is passed over
    (in-flight prefix sharing): it stays queued, holding nothing, and takes them from the cache once
    they are complete, so a shared prefix is computed once however many chunks it takes.
    """

    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        batch = ScheduledBatch()
        scheduled: set[int] = set()
        preempted = False
        decodes = [s for s in self.running if len(s) - s.num_computed_tokens == 1]
        prefills = [s for s in self.running if len(s) - s.num_computed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            if seq.spec_token_ids:  # a decode that also verifies proposals: 1 + k tokens, within budget
                del seq.spec_token_ids[budget - 1 :]
                if seq.spec_draft_probs is not None:
                    seq.spec_draft_probs = seq.spec_draft_probs[: len(seq.spec_token_ids)]
            num_new = min(len(seq) + len(seq.spec_token_ids) - seq.num_computed_tokens, budget)
            while not bm.allocate(seq, seq.num_computed_tokens + num_new):
                victim = next(s for s in reversed(self.running) if id(s) not in scheduled)
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            scheduled.add(id(seq))
            budget -= num_new

        if not preempted:
            self._admit(batch, budget)
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        """Admit waiting sequences in arrival order while budget, sequence slots and KV blocks last,
        passing over those that wait for blocks another sequence is computing."""
        bm = self.block_manager
        # From the head of the queue, so that a step costs what it admits, not what waits (a copy of
        # the queue, or remove() from its middle, would cost every step O(queue)).
        passed_over: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if bm.waits_for_inflight(seq):
                passed_over.append(self.waiting.popleft())
                continue
            num_new = bm.admit(seq, budget)
            if num_new is None:  # too few free blocks: try again once some are freed
                break
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
                seq.first_scheduled_time = time.perf_counter()
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        self.waiting.extendleft(reversed(passed_over))  # back in arrival order, at the head

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.spec_token_ids, seq.spec_draft_probs = [], None
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a sequence from whichever queue holds it and free its blocks."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
