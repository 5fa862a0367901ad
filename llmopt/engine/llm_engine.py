"""The engine: requests in (from any thread), one batched step at a time, outputs out. It schedules,
runs the model and hands off: the logits are prepared in logits_processing.py, proposals made and
verified by the Speculator (spec_decode/speculator.py), outputs built by the OutputBuilder
(output_builder.py); sampling, stopping and the step log each live in their own module too."""

from __future__ import annotations

import itertools
import logging
import queue
import time
import zlib

import torch
from transformers import GenerationConfig

from llmopt.checkpoints import is_gguf, load_tokenizer, resolve_model
from llmopt.engine.block_manager import BlockManager
from llmopt.engine.config import EngineConfig
from llmopt.engine.detokenizer import IncrementalDetokenizer
from llmopt.engine.kv_disk_tier import KVDiskTier
from llmopt.engine.logits_processing import PreparedLogits, SeqRows, batch_rows, prepare_logits, score_prompt
from llmopt.engine.model_runner import ModelRunner
from llmopt.engine.models.model_config import read_model_config
from llmopt.engine.output_builder import OutputBuilder, OutputCallback, Request
from llmopt.engine.outputs import EngineStats, RequestOutput
from llmopt.engine.sampler import greedy_tokens, sample_rows
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.scheduler import ScheduledBatch, Scheduler
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.draft import DraftProposer
from llmopt.engine.spec_decode.ngram import NgramProposer
from llmopt.engine.spec_decode.speculator import Speculator
from llmopt.engine.step_log import StepLog, StepRecord
from llmopt.engine.structured.compiler import GrammarCompiler
from llmopt.engine.structured.sequence_grammar import SequenceGrammar
from llmopt.gguf_file import read_gguf_file
from llmopt.gguf_model import end_of_generation_ids

log = logging.getLogger(__name__)
# The warm-up's prefill: enough to start the OpenMP pool and page in the weights, which is what a first
# request would otherwise pay (a fresh engine's first 512-token prefill took 0.55 s against 0.39 s after).
# After a 64-token warm-up (0.17 s) the first 512-token prefill took 0.31-0.34 s against 0.28-0.30 s
# later, so warming up on a full 512-token step would add 0.37 s to every start to save ~0.03 s once.
WARM_UP_TOKENS = 64


class LLMEngine:
    """add_request / abort_request / step. Thread-safe to add and abort from other threads: requests
    queue up and join the batch at the start of the next step."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.checkpoint = resolve_model(config.model)
        log.info("model: %s", self.checkpoint)
        self.tokenizer = load_tokenizer(self.checkpoint)
        model_max = int(getattr(read_model_config(self.checkpoint), "max_position_embeddings", 8192))
        self.max_model_len = min(config.max_model_len or min(model_max, 8192), model_max)
        self.runner = ModelRunner(config, self.checkpoint, self.max_model_len)
        self.disk_tier = KVDiskTier.open(config, self.checkpoint, self.runner.kv_cache, self.runner.dtype)
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.inflight_prefix_sharing,
            self.disk_tier,
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.eos_token_ids = self._eos_token_ids()
        self.vocab_size: int = self.runner.model.config.vocab_size
        self.speculator = Speculator(
            SpeculativeConfig.parse(config.speculative_config),
            config,
            self.vocab_size,
            self.max_model_len,
            self.eos_token_ids,
        )
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids))
        self.step_log = StepLog()
        if self.disk_tier is not None:  # its restores are weighed against the prefills steps measure
            self.step_log.step_observers.append(self.disk_tier.cost.observe_step)
        self.outputs = OutputBuilder(
            self.scheduler, self.step_log, self.eos_token_ids, self.max_model_len, self.speculator.release
        )
        self._new: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._request_counter = itertools.count()

    @property
    def proposer(self) -> NgramProposer | DraftProposer | None:
        return self.speculator.proposer

    def warm_up(self) -> None:
        """A short prefill and a decode step run once on the calling thread (the one that will
        step), before the first request, as vLLM and llama.cpp's server do at start-up."""
        bm = self.block_manager
        assert not self.outputs.requests and bm.num_used_blocks == 0, "warm up before any request"
        assert not bm.hash_to_block_id, "warm up before the prefix cache holds anything: it writes blocks 0.."
        num_tokens = min(WARM_UP_TOKENS, self.config.max_num_batched_tokens, self.max_model_len - 1)
        start = time.perf_counter()
        self.runner.warm_up(num_tokens)
        if self.disk_tier is not None:  # a first prefill rate, before any step has measured one
            self.disk_tier.cost.observe_prefill(num_tokens, time.perf_counter() - start)

    def close(self) -> None:
        """Write the prefix cache's blocks out to the disk tier, if there is one, and leave it: what a
        stop does, so that a restart finds them (call it where steps run, after the last)."""
        if self.disk_tier is not None and self.block_manager.disk is not None:
            self.disk_tier.close(self.block_manager.cached_blocks())
            self.block_manager.disk = None

    def _eos_token_ids(self) -> set[int]:
        if is_gguf(self.checkpoint):  # what llama.cpp stops on, from the file's vocabulary
            return end_of_generation_ids(read_gguf_file(self.checkpoint), self.tokenizer.get_vocab())
        ids: set[int] = set()
        try:
            eos = GenerationConfig.from_pretrained(self.checkpoint).eos_token_id
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
            seq.grammar = SequenceGrammar(compiled, self.vocab_size)
        self._new.put(Request(seq, IncrementalDetokenizer(self.tokenizer, token_ids, params.stop), on_output))
        return request_id

    def check_token_ids(self, token_ids: list[int]) -> None:
        """A ValueError unless every id is in the model's vocabulary."""
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")

    def abort_request(self, request_id: str) -> None:
        self._aborts.put(request_id)

    def abort_all(self) -> list[RequestOutput]:
        """End every queued and running request with finish_reason 'abort', without running the model
        (used when shutting down, or after a failed step)."""
        self._drain_new()
        for request_id in list(self.outputs.requests):
            self.abort_request(request_id)
        return self._drain_queues()

    def reset_prefix_cache(self) -> int:
        """Forget the prefix cache's free blocks (call it where steps run: the engine thread)."""
        return self.block_manager.reset_prefix_cache()

    def num_waiting(self) -> int:
        """Requests not yet running (safe to call from any thread)."""
        return len(self.scheduler.waiting) + self._new.qsize()

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs.requests) or not self._new.empty()

    def _drain_new(self) -> None:
        while not self._new.empty():
            request = self._new.get()
            self.outputs.requests[request.seq.request_id] = request
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
            request = self.outputs.requests.get(request_id)
            if request is not None:
                outputs.append(self.outputs.end(request.seq, "abort"))
        return outputs

    # ---- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batched forward; return the outputs it produced (each also goes to its callback).
        What it computed and cost goes to the step log (step_log.py)."""
        counters = self.outputs.counters
        start, cpu, generated = time.perf_counter(), time.thread_time(), counters.generation_tokens
        tiers = self._tier_counts()
        outputs, batch, schedule_s, forward_s = self._step()
        if batch.seqs:
            prefill = [n for n in batch.num_new_tokens if n > 1]
            cached, disk, read, write_blocks, write_bytes = (
                b - a for a, b in zip(tiers, self._tier_counts())
            )
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
                generated_tokens=counters.generation_tokens - generated,
                num_running=len(self.scheduler.running),
                num_waiting=self.num_waiting(),
                cached_tokens=cached,
                disk_hit_tokens=disk,
                disk_read_bytes=read,
                disk_write_blocks=write_blocks,
                disk_write_bytes=write_bytes,
            )
            self.step_log.step(record)
        return outputs

    def _tier_counts(self) -> tuple[int, int, int, int, int]:
        """Prompt tokens served from the prefix cache (both tiers), from disk, bytes read from disk, and
        blocks and bytes queued for writing, so far."""
        bm, tier = self.block_manager, self.disk_tier
        if tier is None:
            return bm.prefix_cache_hits, 0, 0, 0, 0
        t = tier.stats
        return bm.prefix_cache_hits, bm.prefix_cache_disk_hits, t.bytes_read, t.blocks_queued, t.bytes_queued

    @torch.inference_mode()
    def _step(self) -> tuple[list[RequestOutput], ScheduledBatch, float, float]:
        """step(), and the batch it ran with the seconds its scheduling and its forward took."""
        outputs = self._drain_queues()
        if self.speculator.wanted(self.scheduler.running):
            self.speculator.propose(self.scheduler.running)
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        schedule_s = time.perf_counter() - start
        if not batch.seqs:
            return outputs, batch, schedule_s, 0.0
        counts, places = batch_rows(batch.seqs, batch.num_new_tokens)
        start = time.perf_counter()
        logits = self.runner.run(batch, counts)
        forward_s = time.perf_counter() - start
        self.speculator.record_step(batch.seqs, batch.num_new_tokens, forward_s)
        prepared = prepare_logits(
            batch.seqs, logits, [p.sample for p in places], self.eos_token_ids, self.vocab_size
        )
        outputs += self._postprocess(batch, logits, places, prepared)
        return outputs, batch, schedule_s, forward_s

    def _postprocess(
        self, batch: ScheduledBatch, logits: torch.Tensor, places: list[SeqRows], prepared: PreparedLogits
    ) -> list[RequestOutput]:
        """Pick every sequence's next tokens from its prepared rows and hand them out; a prefill chunk
        with more to come only moves on. A request whose rows, tokens or text fail ends alone."""
        # One greedy call for every row, after every change to them (one per sequence: 4 % of a 16-row
        # step); with prompt rows in the batch (hundreds of them), each sequence picks from its own rows.
        greedy = greedy_tokens(logits) if not any(p.scored for p in places) else None
        now = time.perf_counter()
        outputs = []
        for seq, n, place in zip(batch.seqs, batch.num_new_tokens, places):
            picks = None if greedy is None else greedy[place.sample]
            try:
                if id(seq) in prepared.errors:
                    raise prepared.errors[id(seq)]
                if seq.needs_prompt_logits:
                    score_prompt(seq, logits[place.prompt])
                if place.sampled:
                    raw = prepared.raws.get(id(seq))
                    outputs.append(self._advance(seq, n, logits[place.sample], picks, now, raw))
            except Exception as exc:  # this request's sampling, stop check or text failed: it alone ends
                log.exception("request %s failed; the batch goes on", seq.request_id)
                outputs.append(self.outputs.fail(seq, exc))
                continue
            if not place.sampled:  # a prefill chunk with more to come
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
        return outputs

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
            return self.outputs.end(seq, "length")
        if greedy is None and seq.params.greedy:
            greedy = greedy_tokens(logits)
        new_tokens = self._next_tokens(seq, n, logits, greedy)
        if seq.grammar is not None:
            seq.grammar.accept(new_tokens)
        seq.token_ids.extend(new_tokens)
        self.block_manager.cache_full_blocks(seq)
        return self.outputs.emit(seq, new_tokens, now, raw)

    def _next_tokens(
        self, seq: Sequence, n: int, logits: torch.Tensor, greedy: list[int] | None
    ) -> list[int]:
        """The tokens `seq` gains from this step's `n` computed tokens and their `logits` rows: one sampled
        token, or what the speculator accepts of its proposals."""
        if seq.spec_token_ids:
            return self.speculator.verify(seq, logits, greedy)
        seq.num_computed_tokens += n
        seq.spec_draft_probs = None
        if seq.params.greedy:
            assert greedy is not None, "a greedy sequence's picks are taken before"
            return greedy
        return sample_rows(logits, seq.params, seq.generator)

    def stats(self) -> EngineStats:
        bm, counters, spec = self.block_manager, self.outputs.counters, self.speculator.stats
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.num_waiting(),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            prefix_cache_disk_hits=bm.prefix_cache_disk_hits,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=counters.prompt_tokens,
            generation_tokens=counters.generation_tokens,
            requests_finished=counters.requests_finished,
            spec_drafts=spec.drafts,
            spec_draft_tokens=spec.draft_tokens,
            spec_accepted_tokens=spec.accepted_tokens,
            spec_forced_tokens=spec.forced_tokens,
            spec_acceptance_by_position=spec.acceptance_by_position(),
            spec_mean_acceptance_length=spec.mean_acceptance_length,
            decode_weight_bytes=self.runner.decode_weight_bytes,
            kv_disk=None if self.disk_tier is None else self.disk_tier.snapshot(),
        )


def request_seed(engine_seed: int, request_id: str) -> int:
    """The sampling seed of a request that gives none: the same in every process (str hash() is salted
    per process, so it would not reproduce a run)."""
    return (engine_seed + zlib.crc32(request_id.encode())) % 2**63
