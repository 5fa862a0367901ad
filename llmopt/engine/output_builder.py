"""From a step's new tokens to the RequestOutputs it hands out: the stop check, the detokenizer's text
delta, logprobs, and a request's end (its blocks freed through the scheduler, its final output with the
totals, its trace in the step log)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmopt.engine.detokenizer import IncrementalDetokenizer
from llmopt.engine.outputs import RequestOutput
from llmopt.engine.scheduler import Scheduler
from llmopt.engine.sequence import Sequence
from llmopt.engine.step_log import RequestTrace, StepLog
from llmopt.engine.stop import stop_reason
from llmopt.engine.token_logprobs import TokenLogprob, token_logprobs

OutputCallback = Callable[[RequestOutput], None]


@dataclass
class Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    on_output: OutputCallback | None


@dataclass
class OutputCounters:
    """Totals since start-up, for EngineStats."""

    prompt_tokens: int = 0  # of finished requests
    generation_tokens: int = 0  # handed out
    requests_finished: int = 0  # with finish_reason stop or length


class OutputBuilder:
    """Builds the outputs of the requests it holds (added when they join the batch, dropped at their
    end). `release` is called with the sequence of every request that ends (the speculator forgets it)."""

    def __init__(
        self,
        scheduler: Scheduler,
        step_log: StepLog,
        eos_token_ids: set[int],
        max_model_len: int,
        release: Callable[[Sequence], None],
    ):
        self.scheduler = scheduler
        self.step_log = step_log
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.release = release
        self.requests: dict[str, Request] = {}
        self.counters = OutputCounters()

    def emit(
        self, seq: Sequence, tokens: list[int], now: float, raw: torch.Tensor | None = None
    ) -> RequestOutput:
        """Hand out the tokens a step appended, stopping at the first one that finishes the request;
        with their logprobs from `raw`, the untouched logits rows they were drawn from."""
        request = self.requests[seq.request_id]
        if seq.first_token_time is None:
            seq.first_token_time = now
        start = len(seq) - len(tokens)
        reason = None
        emitted: list[int] = []
        for token in tokens:
            emitted.append(token)
            self.counters.generation_tokens += 1
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
            return self.end(seq, reason, emitted, logprobs)
        output = RequestOutput(seq.request_id, emitted, request.detokenizer.take_delta(False), False)
        output.logprobs, output.prompt_logprobs = logprobs, take_prompt_logprobs(seq)
        if request.on_output is not None:
            request.on_output(output)
        return output

    def end(
        self,
        seq: Sequence,
        reason: str,
        new_tokens: list[int] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> RequestOutput:
        """End a request with `reason` (its blocks freed) and hand out its final output."""
        request = self.requests[seq.request_id]
        self.scheduler.finish(seq, reason)
        return self._finish(request, new_tokens or [], logprobs=logprobs)

    def fail(self, seq: Sequence, exc: Exception) -> RequestOutput:
        """End one request with finish_reason 'error' (its blocks freed), leaving every other one be."""
        error = f"{type(exc).__name__}: {exc}"
        self.scheduler.finish(seq, "error")  # also right for a sequence already finished: it frees nothing
        request = self.requests.get(seq.request_id)
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
        del self.requests[seq.request_id]
        self.release(seq)
        self.counters.prompt_tokens += seq.num_prompt_tokens
        self.counters.requests_finished += seq.finish_reason in ("stop", "length")
        output = RequestOutput(
            seq.request_id,
            new_tokens,
            request.detokenizer.take_delta(True),
            True,
            seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            output_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            disk_cached_tokens=seq.num_disk_cached_tokens,
            error=error,
            logprobs=logprobs,
            prompt_logprobs=take_prompt_logprobs(seq),
        )
        # The request is gone before its callback runs: a callback that fails ends nothing twice.
        if request.on_output is not None:
            request.on_output(output)
        self.step_log.request(request_trace(seq))
        return output


def request_trace(seq: Sequence) -> RequestTrace:
    scheduled, first = seq.first_scheduled_time, seq.first_token_time
    return RequestTrace(
        request_id=seq.request_id,
        prompt_tokens=seq.num_prompt_tokens,
        cached_tokens=seq.num_cached_tokens,
        disk_cached_tokens=seq.num_disk_cached_tokens,
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
