"""The engine: requests in (from any thread), one batched step at a time, outputs out. Scheduling,
the model, sampling, stopping and speculation each live in their own module; this one wires a step."""

from __future__ import annotations

import itertools
import logging
import queue
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoConfig, GenerationConfig

from llmopt.checkpoints import load_tokenizer, resolve_model
from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.detokenizer import IncrementalDetokenizer
from llmopt.engine.logprobs import TokenLogprob, first_prompt_token, token_logprobs
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.outputs import EngineStats, RequestOutput
from llmopt.engine.penalties import apply_penalties
from llmopt.engine.sampler import ban_stop_tokens, greedy_tokens, sample_rows
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch, Scheduler
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode import make_proposer
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.forced import propose_forced
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.policy import ForcedAcceptance, proposal_room, record_acceptance, trim_forced
from llmopt.engine.spec_decode.stats import SpecStats
from llmopt.engine.spec_decode.verify import verify
from llmopt.engine.step_log import RequestTrace, StepLog, StepRecord
from llmopt.engine.stop import stop_reason
from llmopt.engine.structured.bitmask import BatchMask
from llmopt.engine.structured.compiler import GrammarCompiler
from llmopt.engine.structured.sequence_grammar import SequenceGrammar

log = logging.getLogger(__name__)

OutputCallback = Callable[[RequestOutput], None]


@dataclass
class Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    on_output: OutputCallback | None


class LLMEngine:
    """add_request / abort_request / step. Thread-safe to add and abort from other threads: requests
    queue up and join the batch at the start of the next step."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_dir = resolve_model(config.model)
        self.tokenizer = load_tokenizer(self.model_dir)
        model_max = int(getattr(AutoConfig.from_pretrained(self.model_dir), "max_position_embeddings", 8192))
        self.max_model_len = min(config.max_model_len or min(model_max, 8192), model_max)
        self.runner = ModelRunner(config, self.model_dir, self.max_model_len)
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.inflight_prefix_sharing,
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
        self.forced_acceptance = ForcedAcceptance()
        self.grammars = GrammarCompiler(self.tokenizer, vocab, sorted(self.eos_token_ids))
        self._new: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self._request_counter = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0
        self.step_log = StepLog()

    def warm_up(self) -> None:
        """A step's worth of prefill and a decode step run once on the calling thread (the one that will
        step), before the first request, as vLLM and llama.cpp's server do at start-up."""
        bm = self.block_manager
        assert not self._requests and bm.num_used_blocks == 0, "warm up before any request"
        assert not bm.hash_to_block_id, "warm up before the prefix cache holds anything: it writes blocks 0.."
        self.runner.warm_up(min(self.config.max_num_batched_tokens, self.max_model_len - 1))

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

    def chat_token_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt tokens of a conversation under the tokenizer's chat template (`tools` only for a
        template that renders them)."""
        return list(
            self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
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
        self.check_token_ids(token_ids + params.stop_token_ids + list(params.logit_bias))
        request_id = request_id or f"req-{next(self._request_counter)}"
        seq = Sequence(request_id, token_ids, params, seed=request_seed(self.config.seed, request_id))
        if params.structured_output is not None:  # the server compiled it already: a cache hit here
            compiled = self.grammars.compile(params.structured_output)
            seq.grammar = SequenceGrammar(compiled, self.runner.model.config.vocab_size)
        self._new.put(Request(seq, IncrementalDetokenizer(self.tokenizer, token_ids, params.stop), on_output))
        return request_id

    def check_token_ids(self, token_ids: list[int]) -> None:
        """A ValueError unless every id is in the model's vocabulary."""
        vocab = self.runner.model.config.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"token ids must be in [0, {vocab})")

    def abort_request(self, request_id: str) -> None:
        self._aborts.put(request_id)

    def abort_all(self) -> list[RequestOutput]:
        """End every queued and running request with finish_reason 'abort', without running the model
        (used when shutting down, or after a failed step)."""
        self._drain_new()
        for request_id in list(self._requests):
            self.abort_request(request_id)
        return self._drain_queues()

    def reset_prefix_cache(self) -> int:
        """Forget the prefix cache's free blocks (call it where steps run: the engine thread)."""
        return self.block_manager.reset_prefix_cache()

    def num_waiting(self) -> int:
        """Requests not yet running (safe to call from any thread)."""
        return len(self.scheduler.waiting) + self._new.qsize()

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or not self._new.empty()

    def _drain_new(self) -> None:
        while not self._new.empty():
            request = self._new.get()
            self._requests[request.seq.request_id] = request
            self.scheduler.add(request.seq)

    def _drain_queues(self) -> list[RequestOutput]:
        """Take in new requests and apply aborts. The aborts are taken first: an abort always follows its
        request's add, so every abort taken here finds its request, even one whose add and abort both
        landed while the queues were being drained (taking new requests first would lose that abort)."""
        abort_ids = []
        while not self._aborts.empty():
            abort_ids.append(self._aborts.get())
        self._drain_new()
        outputs = []
        for request_id in abort_ids:
            request = self._requests.get(request_id)
            if request is not None:
                self.scheduler.finish(request.seq, "abort")
                outputs.append(self._finish(request, []))
        return outputs

    # ---- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batched forward; return the outputs it produced (each also goes to its callback).
        What it computed and cost goes to the step log (step_log.py)."""
        start, cpu, generated = time.perf_counter(), time.thread_time(), self.generation_tokens_total
        outputs, batch, schedule_s, forward_s = self._step()
        if batch.seqs:
            prefill = [n for n in batch.num_new_tokens if n > 1]
            record = StepRecord(
                start=start,
                duration_s=time.perf_counter() - start,
                cpu_s=time.thread_time() - cpu,
                idle_before_s=self.step_log.idle_since_last_step(start),
                schedule_s=schedule_s,
                forward_s=forward_s,
                prefill_tokens=sum(prefill),
                prefill_seqs=len(prefill),
                decode_rows=len(batch) - len(prefill),
                generated_tokens=self.generation_tokens_total - generated,
                num_running=len(self.scheduler.running),
                num_waiting=self.num_waiting(),
            )
            self.step_log.step(record)
        return outputs

    @torch.inference_mode()
    def _step(self) -> tuple[list[RequestOutput], ScheduledBatch, float, float]:
        """step(), and the batch it ran with the seconds its scheduling and its forward took."""
        outputs = self._drain_queues()
        if self.proposer is not None or any(s.grammar is not None for s in self.scheduler.running):
            self._propose()
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        schedule_s = time.perf_counter() - start
        if not batch.seqs:
            return outputs, batch, schedule_s, 0.0
        rows = [logit_rows(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]
        counts = [scored + sampled for scored, sampled in rows]
        start = time.perf_counter()
        logits = self.runner.run(batch, counts)
        forward_s = time.perf_counter() - start
        starts = list(itertools.accumulate(counts, initial=0))
        samples = [
            slice(start + scored, start + scored + sampled) for start, (scored, sampled) in zip(starts, rows)
        ]
        raws, errors = self._process_logits(batch.seqs, logits, samples)
        # One greedy call for every row, after every change to them (one per sequence: 4 % of a 16-row
        # step); with prompt rows in the batch (hundreds of them), each sequence picks from its own rows.
        greedy = greedy_tokens(logits) if not any(scored for scored, _ in rows) else None
        now = time.perf_counter()
        for seq, n, start, (scored, sampled), sample in zip(
            batch.seqs, batch.num_new_tokens, starts, rows, samples
        ):
            picks = None if greedy is None else greedy[sample]
            try:
                if id(seq) in errors:
                    raise errors[id(seq)]
                if seq.needs_prompt_logits:
                    self._score_prompt(seq, logits[start : start + scored])
                if sampled:
                    outputs.append(self._advance(seq, n, logits[sample], picks, now, raws.get(id(seq))))
            except Exception as exc:  # this request's sampling, stop check or text failed: it alone ends
                log.exception("request %s failed; the batch goes on", seq.request_id)
                outputs.append(self._fail(seq, exc))
                continue
            if not sampled:  # a prefill chunk with more to come
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
        return outputs, batch, schedule_s, forward_s

    def _process_logits(
        self, seqs: list[Sequence], logits: torch.Tensor, samples: list[slice]
    ) -> tuple[dict[int, torch.Tensor], dict[int, Exception]]:
        """Change every sequence's sampled rows of `logits` in place before any token is picked, so one
        batched pick sees them final: penalties, the grammar's mask (every grammar row of the step filled
        into one bitmask and applied in one call), the min_tokens ban. Returns, by id(seq), the untouched
        rows of those that asked for logprobs, and the error of any whose rows could not be prepared."""
        raws: dict[int, torch.Tensor] = {}
        errors: dict[int, Exception] = {}
        grammar_rows = sum(s.stop - s.start for seq, s in zip(seqs, samples) if seq.grammar is not None)
        # Most steps have no grammar row: they allocate no bitmask.
        masks = BatchMask(grammar_rows, self.runner.model.config.vocab_size) if grammar_rows else None
        for seq, sample in zip(seqs, samples):
            if sample.start == sample.stop or seq.params.max_tokens == 0:
                continue
            rows = logits[sample]
            try:
                # Logprobs are of the model's own distribution (vLLM's raw_logprobs): kept before
                # anything changes the rows.
                if seq.params.logprobs is not None:
                    raws[id(seq)] = rows.clone()
                apply_penalties(rows, seq)
                if seq.grammar is not None:  # row by row through the proposals (masks: counted above)
                    masks.fill(seq.grammar, sample, seq.spec_token_ids)
                ban_stop_tokens(rows, self.eos_token_ids, seq.params, seq.num_output_tokens)
            except Exception as exc:
                errors[id(seq)] = exc
        if masks is not None:
            masks.apply(logits)
        return raws, errors

    def _score_prompt(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Record the logprobs of the prompt tokens this chunk's rows predict (row i: the token at
        position start + i + 1); a recompute after a preemption writes them again."""
        start = seq.num_computed_tokens
        if start == 0:
            seq.prompt_logprobs = [first_prompt_token(seq.token_ids[0])]
        assert seq.prompt_logprobs is not None and len(seq.prompt_logprobs) >= start + 1
        del seq.prompt_logprobs[start + 1 :]
        targets = seq.token_ids[start + 1 : start + 1 + len(logits)]
        seq.prompt_logprobs += token_logprobs(logits, targets, seq.params.prompt_logprobs)

    def _advance(
        self,
        seq: Sequence,
        n: int,
        logits: torch.Tensor,
        greedy: list[int] | None,
        now: float,
        raw: torch.Tensor | None,
    ) -> RequestOutput:
        """Sample (or verify) `seq`'s next tokens from its logits rows, already processed, and hand them
        out. `greedy`: the rows' argmax if the batch took it (None: take it here); `raw`: the rows before
        processing, for logprobs."""
        if seq.params.max_tokens == 0:  # only the prompt was to be scored (echo with max_tokens 0)
            seq.num_computed_tokens += n
            self.scheduler.finish(seq, "length")
            return self._finish(self._requests[seq.request_id], [])
        if greedy is None and seq.params.greedy:
            greedy = greedy_tokens(logits)
        new_tokens = self._next_tokens(seq, n, logits, greedy)
        if seq.grammar is not None:
            seq.grammar.accept(new_tokens)
        seq.token_ids.extend(new_tokens)
        self.block_manager.cache_full_blocks(seq)
        return self._emit(seq, new_tokens, now, raw)

    def _next_tokens(
        self, seq: Sequence, n: int, logits: torch.Tensor, greedy: list[int] | None
    ) -> list[int]:
        """The tokens `seq` gains from this step's `n` computed tokens and their `logits` rows: one sampled
        token, or the accepted proposals and a corrected or bonus token."""
        if not seq.spec_token_ids:
            seq.num_computed_tokens += n
            seq.spec_draft_probs = None
            if seq.params.greedy:
                assert greedy is not None, "a greedy sequence's picks are taken before"
                return greedy
            return sample_rows(logits, seq.params, seq.generator)
        new_tokens, accepted = verify(
            logits, seq.spec_token_ids, seq.spec_draft_probs, seq, self.eos_token_ids, greedy=greedy
        )
        forced = min(seq.spec_num_forced, len(seq.spec_token_ids))
        self.spec_stats.record(len(seq.spec_token_ids), accepted, forced)
        if forced:  # forced tokens are paced by their acceptance at each position, engine-wide
            self.forced_acceptance.record(forced, accepted)
        else:
            record_acceptance(seq, accepted)
        # KV is valid up to the last accepted proposal; the rejected slots are overwritten later.
        seq.num_computed_tokens += 1 + accepted
        seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = [], None, 0
        return new_tokens

    def _propose(self) -> None:
        """Give every decoding sequence its proposals to verify in this step: the tokens its grammar
        forces (n-gram lookups may continue past them), or else up to k from the proposer, cut where
        the grammar refuses one. Forced proposals are then cut to those expected to pay at this batch
        size (policy.trim_forced)."""
        k = self.speculative_config.num_speculative_tokens if self.speculative_config else 0
        ngram = self.proposer if isinstance(self.proposer, NgramProposer) else None
        ready, ks, forced = [], [], False
        for seq in self.scheduler.running:
            if propose_forced(seq, self.max_model_len, ngram, k):
                forced = True
                continue
            room = proposal_room(seq, k, self.max_model_len) if self.proposer is not None else 0
            if room > 0:
                ready.append(seq)
                ks.append(room)
        if ready:
            for seq, proposal in zip(ready, self.proposer.propose(ready, ks)):
                tokens, probs = proposal.tokens, proposal.draft_probs
                if seq.grammar is not None:
                    tokens = tokens[: seq.grammar.valid_prefix(tokens)]
                    probs = probs[: len(tokens)] if probs is not None and tokens else None
                seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = tokens, probs, 0
        if forced:
            decoding = [s for s in self.scheduler.running if s.num_computed_tokens == len(s) - 1]
            trim_forced(decoding, self.forced_acceptance)

    def _emit(
        self, seq: Sequence, tokens: list[int], now: float, raw: torch.Tensor | None = None
    ) -> RequestOutput:
        """Hand out the tokens a step appended, stopping at the first one that finishes the request;
        with their logprobs from `raw`, the untouched logits rows they were drawn from."""
        request = self._requests[seq.request_id]
        if seq.first_token_time is None:
            seq.first_token_time = now
        start = len(seq) - len(tokens)
        reason = None
        emitted: list[int] = []
        for token in tokens:
            emitted.append(token)
            self.generation_tokens_total += 1
            length = start + len(emitted)
            reason = stop_reason(
                seq, token, length, request.detokenizer, self.eos_token_ids, self.max_model_len
            )
            if reason is not None:
                break
        logprobs = None
        if raw is not None:  # row i of a verification's logits is where its i-th new token came from
            logprobs = token_logprobs(raw[: len(emitted)], emitted, seq.params.logprobs)
        if reason is not None:
            del seq.token_ids[start + len(emitted) :]  # accepted tokens past the stop are dropped
            self.scheduler.finish(seq, reason)
            return self._finish(request, emitted, logprobs=logprobs)
        output = RequestOutput(seq.request_id, emitted, request.detokenizer.take_delta(False), False)
        output.logprobs, output.prompt_logprobs = logprobs, take_prompt_logprobs(seq)
        if request.on_output is not None:
            request.on_output(output)
        return output

    def _fail(self, seq: Sequence, exc: Exception) -> RequestOutput:
        """End one request with finish_reason 'error' (its blocks freed), leaving every other one be."""
        error = f"{type(exc).__name__}: {exc}"
        self.scheduler.finish(seq, "error")  # also right for a sequence already finished: it frees nothing
        request = self._requests.get(seq.request_id)
        if request is None:  # it failed after its own end was handed out: nothing is left to end
            return RequestOutput(seq.request_id, [], "", True, "error", error=error)
        return self._finish(request, [], error=error)

    def _finish(
        self,
        request: Request,
        new_tokens: list[int],
        error: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> RequestOutput:
        seq = request.seq
        seq.finish_time = time.perf_counter()
        del self._requests[seq.request_id]
        if self.proposer is not None:
            self.proposer.release(seq.request_id)
        self.prompt_tokens_total += seq.num_prompt_tokens
        self.requests_finished += seq.finish_reason in ("stop", "length")
        output = RequestOutput(
            seq.request_id,
            new_tokens,
            request.detokenizer.take_delta(True),
            True,
            seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            output_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            error=error,
            logprobs=logprobs,
            prompt_logprobs=take_prompt_logprobs(seq),
        )
        if request.on_output is not None:
            request.on_output(output)
        self.step_log.request(request_trace(seq))
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
            spec_forced_tokens=self.spec_stats.forced_tokens,
            spec_acceptance_by_position=self.spec_stats.acceptance_by_position(),
            spec_mean_acceptance_length=self.spec_stats.mean_acceptance_length,
        )


def request_seed(engine_seed: int, request_id: str) -> int:
    """The sampling seed of a request that gives none: the same in every process (str hash() is salted
    per process, so it would not reproduce a run)."""
    return (engine_seed + zlib.crc32(request_id.encode())) % 2**63


def logit_rows(seq: Sequence, n: int) -> tuple[int, int]:
    """(rows scored, rows sampled) of `seq`'s `n` new tokens this step. A sequence whose new tokens reach
    the end of its context samples from one row, or from 1 + k when it verifies k proposed tokens; one
    whose prompt is being scored for prompt logprobs also gets every row before those (row i predicts
    the prompt token after it)."""
    reaches_end = seq.num_computed_tokens + n == len(seq) + len(seq.spec_token_ids)
    sampled = 1 + len(seq.spec_token_ids) if reaches_end else 0
    return (n - sampled if seq.needs_prompt_logits else 0), sampled


def request_trace(seq: Sequence) -> RequestTrace:
    scheduled, first = seq.first_scheduled_time, seq.first_token_time
    return RequestTrace(
        request_id=seq.request_id,
        prompt_tokens=seq.num_prompt_tokens,
        cached_tokens=seq.num_cached_tokens,
        output_tokens=seq.num_output_tokens,
        queue_s=None if scheduled is None else scheduled - seq.arrival_time,
        ttft_s=None if first is None else first - seq.arrival_time,
        e2e_s=(seq.finish_time or time.perf_counter()) - seq.arrival_time,
        finish_reason=seq.finish_reason,
    )


def take_prompt_logprobs(seq: Sequence) -> list[TokenLogprob] | None:
    """The prompt logprobs to hand out with `seq`'s first output (None after it, or if never asked)."""
    prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
    return prompt_logprobs
