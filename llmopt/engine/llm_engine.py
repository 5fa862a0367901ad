from __future__ import annotations

import itertools
import logging
import math
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoConfig, GenerationConfig

from llmopt.checkpoints import load_tokenizer, resolve_model
from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.detokenizer import IncrementalDetokenizer
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.sampler import ban_stop_tokens, greedy_tokens, sample_rows
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import Scheduler
from llmopt.engine.sequence import RequestOutput, Sequence
from llmopt.engine.spec_decode import SpecStats, SpeculativeConfig, make_proposer, verify

log = logging.getLogger(__name__)

OutputCallback = Callable[[RequestOutput], None]
MAX_SPEC_BACKOFF = 16  # steps without proposals after repeated rejections
SPEC_PROBE_INTERVAL = 4  # steps between proposals while fewer than one token per proposal is accepted


@dataclass
class Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    on_output: OutputCallback | None


@dataclass
class EngineStats:
    """Counters since start-up (for /metrics and benchmarks)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    requests_finished: int  # with finish_reason stop or length
    spec_drafts: int = 0  # verification steps with at least one proposed token
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_acceptance_by_position: list[float] | None = None
    spec_mean_acceptance_length: float = 0.0


class LLMEngine:
    """add_request / abort_request / step. Thread-safe to add and abort from other threads: requests
    queue up and join the batch at the start of the next step."""

    def __init__(self, config: EngineConfig):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_dir = resolve_model(config.model)
        self.tokenizer = load_tokenizer(self.model_dir)
        model_max = int(getattr(AutoConfig.from_pretrained(self.model_dir), "max_position_embeddings", 8192))
        self.max_model_len = min(config.max_model_len or min(model_max, 8192), model_max)
        self.runner = ModelRunner(config, self.model_dir, self.max_model_len)
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.eos_token_ids = self._eos_token_ids()
        self.speculative_config = SpeculativeConfig.parse(config.speculative_config)
        vocab = self.runner.model.config.vocab_size
        self.proposer = (
            make_proposer(self.speculative_config, config, vocab, self.max_model_len)
            if self.speculative_config
            else None
        )
        self.spec_stats = SpecStats()
        self._new: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self._request_counter = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0

    def _eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        try:
            eos = GenerationConfig.from_pretrained(self.model_dir).eos_token_id
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        except OSError:
            pass
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ---- requests -------------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def chat_token_ids(self, messages: list[dict]) -> list[int]:
        """The prompt tokens of a conversation under the tokenizer's chat template."""
        return list(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> str:
        """Queue a request; raises ValueError for a request that can never be served."""
        token_ids = self.tokenize(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request asks "
                f"for {total} ({len(token_ids)} in the prompt + {params.max_tokens} max_tokens)"
            )
        capacity = self.block_manager.num_blocks * self.config.block_size
        if total > capacity:
            raise ValueError(f"the request needs {total} tokens of KV cache; the pool holds {capacity}")
        vocab = self.runner.model.config.vocab_size
        if any(not 0 <= t < vocab for t in token_ids + params.stop_token_ids):
            raise ValueError(f"token ids must be in [0, {vocab})")
        request_id = request_id or f"req-{next(self._request_counter)}"
        seq = Sequence(request_id, token_ids, params, seed=self.config.seed + hash(request_id) % 2**31)
        self._new.put(Request(seq, IncrementalDetokenizer(self.tokenizer, token_ids, params.stop), on_output))
        return request_id

    def abort_request(self, request_id: str) -> None:
        self._aborts.put(request_id)

    def abort_all(self) -> list[RequestOutput]:
        """End every queued and running request with finish_reason 'abort', without running the model
        (used when shutting down, or after a failed step)."""
        self._drain_queues_new()
        for request_id in list(self._requests):
            self.abort_request(request_id)
        return self._drain_queues()

    def num_waiting(self) -> int:
        """Requests not yet running (safe to call from any thread)."""
        return len(self.scheduler.waiting) + self._new.qsize()

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or not self._new.empty()

    def _drain_queues_new(self) -> None:
        while not self._new.empty():
            request = self._new.get()
            self._requests[request.seq.request_id] = request
            self.scheduler.add(request.seq)

    def _drain_queues(self) -> list[RequestOutput]:
        self._drain_queues_new()
        outputs = []
        while not self._aborts.empty():
            request = self._requests.get(self._aborts.get())
            if request is not None:
                self.scheduler.finish(request.seq, "abort")
                outputs.append(self._finish(request, []))
        return outputs

    # ---- the step ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one batched forward; return the outputs it produced (each also goes to its callback)."""
        outputs = self._drain_queues()
        if self.proposer is not None:
            self._propose()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return outputs
        # Sequences whose new tokens reach the end of their context get logits: one row, or 1 + k rows
        # when they verify k proposed tokens.
        counts = [
            1 + len(s.spec_token_ids) if s.num_computed_tokens + n == len(s) + len(s.spec_token_ids) else 0
            for s, n in zip(batch.seqs, batch.num_new_tokens)
        ]
        logits = self.runner.run(batch, counts)
        starts = list(itertools.accumulate(counts, initial=0))
        for seq, start, count in zip(batch.seqs, starts, counts):
            if count and not seq.spec_token_ids:
                ban_stop_tokens(
                    logits[start : start + count], self.eos_token_ids, seq.params, seq.num_output_tokens
                )
        greedy = greedy_tokens(logits)  # one call for every row (one per sequence: 4 % of a 16-row step)
        now = time.perf_counter()
        for seq, n, start, count in zip(batch.seqs, batch.num_new_tokens, starts, counts):
            seq_logits = logits[start : start + count]
            if count == 0:  # a prefill chunk with more to come
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
                continue
            if seq.spec_token_ids:
                new_tokens, accepted = verify(
                    seq_logits, seq.spec_token_ids, seq.spec_draft_probs, seq, self.eos_token_ids
                )
                self.spec_stats.record(len(seq.spec_token_ids), accepted)
                self._adapt_speculation(seq, accepted)
                # KV is valid up to the last accepted proposal; the rejected slots are overwritten later.
                seq.num_computed_tokens += 1 + accepted
                seq.spec_token_ids, seq.spec_draft_probs = [], None
            else:
                new_tokens = (
                    greedy[start : start + count]
                    if seq.params.greedy
                    else sample_rows(seq_logits, seq.params, seq.generator)
                )
                seq.num_computed_tokens += n
                seq.spec_draft_probs = None
            seq.token_ids.extend(new_tokens)
            self.block_manager.cache_full_blocks(seq)
            outputs.append(self._emit(seq, new_tokens, now))
        return outputs

    def _propose(self) -> None:
        """Give every decoding sequence up to k proposed tokens to verify in this step."""
        k = self.speculative_config.num_speculative_tokens
        ready, ks = [], []
        for seq in self.scheduler.running:
            if seq.spec_skip > 0:
                seq.spec_skip -= 1
                continue
            if seq.num_computed_tokens == len(seq) - 1:
                # Propose about one more token than this sequence has recently been accepting.
                recent = k if seq.spec_accepted_ema is None else math.ceil(seq.spec_accepted_ema) + 1
                room = min(
                    k,
                    recent,
                    seq.params.max_tokens - seq.num_output_tokens - 1,
                    self.max_model_len - len(seq) - 1,
                )
                if room > 0:
                    ready.append(seq)
                    ks.append(room)
        if ready:
            for seq, proposal in zip(ready, self.proposer.propose(ready, ks)):
                seq.spec_token_ids, seq.spec_draft_probs = proposal.tokens, proposal.draft_probs

    @staticmethod
    def _adapt_speculation(seq: Sequence, accepted: int) -> None:
        """Verifying k proposals costs k more rows in every layer's GEMMs (on this CPU about as much
        as the tokens it may save), so a sequence whose proposals keep failing proposes less: after a
        step with nothing accepted it pauses (1, 2, 4 ... steps), and while it accepts fewer than one
        token per proposal on average it only probes every few steps. Greedy outputs are unchanged."""
        ema = seq.spec_accepted_ema
        seq.spec_accepted_ema = accepted if ema is None else 0.7 * ema + 0.3 * accepted
        seq.spec_backoff = 0 if accepted else min(2 * seq.spec_backoff or 1, MAX_SPEC_BACKOFF)
        seq.spec_skip = max(seq.spec_backoff, SPEC_PROBE_INTERVAL if seq.spec_accepted_ema < 1 else 0)

    def _emit(self, seq: Sequence, tokens: list[int], now: float) -> RequestOutput:
        """Hand out the tokens a step appended, stopping at the first one that finishes the request."""
        request = self._requests[seq.request_id]
        if seq.first_token_time is None:
            seq.first_token_time = now
        params = seq.params
        start = len(seq) - len(tokens)
        reason = None
        emitted: list[int] = []
        for token in tokens:
            emitted.append(token)
            self.generation_tokens_total += 1
            length = start + len(emitted)
            if token in self.eos_token_ids and not params.ignore_eos or token in params.stop_token_ids:
                reason = "stop"
            elif request.detokenizer.add(token) is not None:
                reason = "stop"
            elif length - seq.num_prompt_tokens >= params.max_tokens or length >= self.max_model_len:
                reason = "length"
            if reason is not None:
                break
        if reason is not None:
            del seq.token_ids[start + len(emitted) :]  # accepted tokens past the stop are dropped
            self.scheduler.finish(seq, reason)
            return self._finish(request, emitted)
        output = RequestOutput(seq.request_id, emitted, request.detokenizer.take_delta(False), False)
        if request.on_output is not None:
            request.on_output(output)
        return output

    def _finish(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        seq = request.seq
        seq.finish_time = time.perf_counter()
        del self._requests[seq.request_id]
        if self.proposer is not None:
            self.proposer.release(seq.request_id)
        self.prompt_tokens_total += seq.num_prompt_tokens
        self.requests_finished += seq.finish_reason != "abort"
        output = RequestOutput(
            seq.request_id,
            new_tokens,
            request.detokenizer.take_delta(True),
            True,
            seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            output_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
        )
        if request.on_output is not None:
            request.on_output(output)
        return output

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.num_waiting(),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.generation_tokens_total,
            requests_finished=self.requests_finished,
            spec_drafts=self.spec_stats.drafts,
            spec_draft_tokens=self.spec_stats.draft_tokens,
            spec_accepted_tokens=self.spec_stats.accepted_tokens,
            spec_acceptance_by_position=self.spec_stats.acceptance_by_position(),
            spec_mean_acceptance_length=self.spec_stats.mean_acceptance_length,
        )
