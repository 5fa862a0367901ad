"""Admitting a validated request into the engine: one SamplingParams per choice, then the queue
limit, then the engine's own checks, each refusal an APIError with the status OpenAI clients expect."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.structured.request import StructuredOutput
from llmopt.server.error_bodies import APIError
from llmopt.server.metrics import ServerMetrics
from llmopt.server.protocol import ChatCompletionRequest, SamplingRequest
from llmopt.server.request_group import RequestGroup
from llmopt.server.structured_outputs import forced_tokens


def sampling_params(
    req: SamplingRequest,
    max_tokens: int | None,
    prompt_len: int,
    index: int,
    max_model_len: int,
    structured_output: StructuredOutput | None = None,
) -> SamplingParams:
    """The parameters of choice `index` (0 .. n-1) of one prompt; no max_tokens means the rest of the
    context, as OpenAI does. `structured_output` has been compiled (structured_outputs.py)."""
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
        if max_tokens < 1:
            raise APIError(
                400,
                f"this model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len}",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
            )
    if req.min_tokens > max_tokens:
        raise APIError(400, "min_tokens must not exceed max_tokens", param="min_tokens")
    if structured_output is not None and req.min_tokens > 0:
        # Where the grammar is complete only a stop token may follow, which min_tokens would ban.
        raise APIError(400, "min_tokens cannot be combined with a structured output", param="min_tokens")
    # Offset by the choice's index so that n choices differ, while choice 0 samples what a single
    # request with the same seed would.
    seed = None if req.seed is None else req.seed + index
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=seed,
        stop=req.stop_list(),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        structured_output=structured_output,
        forced_tokens=forced_tokens(req),
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias=req.logit_bias_ids(),
        min_p=req.min_p or 0.0,
        logprobs=req.num_logprobs(),
        prompt_logprobs=req.num_prompt_logprobs(),
    )


@dataclass(frozen=True)
class Admission:
    engine: LLMEngine
    engine_thread: EngineThread
    metrics: ServerMetrics
    max_queue_len: int | None

    def start(
        self,
        req: SamplingRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        structured_output: StructuredOutput | None = None,
    ) -> RequestGroup:
        """Every prompt times n, running in the engine; all of them or (on an APIError) none. A
        `structured_output` must have been compiled (structured_outputs.compile_output): the engine
        then finds it in its cache."""
        expanded = [p for p in prompts for _ in range(req.n)]
        max_model_len = self.engine.max_model_len
        self.check_logit_bias(req)
        params = [
            sampling_params(req, max_tokens, len(p), i % req.n, max_model_len, structured_output)
            for i, p in enumerate(expanded)
        ]
        if self.max_queue_len is not None and self.engine.num_waiting() + len(expanded) > self.max_queue_len:
            raise APIError(
                429,
                f"the server's queue is full ({self.max_queue_len} waiting requests); retry later",
                "rate_limit_error",
                code="queue_full",
            )
        try:
            return RequestGroup(self.engine_thread, self.metrics, expanded, params, req.n)
        except ValueError as exc:  # a request the engine can never serve: the client's to fix
            raise APIError(400, str(exc), param="prompt") from None
        except RuntimeError as exc:  # the engine is shutting down
            raise APIError(503, str(exc), "server_error") from None

    def check_logit_bias(self, req: SamplingRequest) -> None:
        """Biased token ids must be in the vocabulary: a 400 naming logit_bias (not the prompt)."""
        try:
            self.engine.check_token_ids(list(req.logit_bias_ids()))
        except ValueError as exc:
            raise APIError(400, f"logit_bias: {exc}", param="logit_bias") from None
