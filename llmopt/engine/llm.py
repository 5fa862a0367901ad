from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from llmopt.engine.config import EngineConfig
from llmopt.engine.kv_disk_tier import close_at_exit
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.token_logprobs import TokenLogprob


@dataclass
class CompletionOutput:
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, from the prefix cache (either tier)
    disk_cached_tokens: int = 0  # of those, loaded from the disk tier
    logprobs: list[TokenLogprob] | None = None  # one per output token, when asked for
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token (the first: logprob None)


class LLM:
    """In-process API: `LLM(model).generate(prompts, SamplingParams(...))`, batched by the engine."""

    def __init__(self, model: str | None = None, **engine_options):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options))
        self.tokenizer = self.engine.tokenizer
        # As `llmopt serve` does before its first request: without it the fp32 decode steps of the first
        # three 128-token prompts took 22-23 ms against 17 ms after it (benchmarks/serving_path.py).
        # The thread that builds an LLM is the one that steps it.
        self.engine.warm_up()
        # Its prefix cache's blocks go to the KV disk tier when the interpreter exits, as a server's do
        # when it stops: an LLM steps on its caller's thread, so at exit nothing else touches the pool.
        close_at_exit(weakref.WeakMethod(self.engine.close))

    def close(self) -> None:
        """Write the prefix cache's blocks to the KV disk tier now (what exiting does anyway)."""
        self.engine.close()

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        assert len(params_list) == len(prompts), "one SamplingParams per prompt"
        results = {}
        for prompt, p in zip(prompts, params_list):
            request_id = self.engine.add_request(prompt, p)
            results[request_id] = CompletionOutput(request_id)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                result = results[out.request_id]
                result.text += out.new_text
                result.token_ids += out.new_token_ids
                if out.logprobs is not None:
                    result.logprobs = result.logprobs or []
                    result.logprobs += out.logprobs
                if out.prompt_logprobs is not None:
                    result.prompt_logprobs = out.prompt_logprobs
                if out.finished:
                    result.finish_reason = out.finish_reason
                    result.prompt_tokens = out.prompt_tokens
                    result.cached_tokens = out.cached_tokens
                    result.disk_cached_tokens = out.disk_cached_tokens
        return list(results.values())

    def chat_prompt(self, user_message: str) -> list[int]:
        """Token ids of a one-turn chat with the tokenizer's chat template."""
        return self.engine.chat_token_ids([{"role": "user", "content": user_message}])
