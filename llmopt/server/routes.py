"""The HTTP routes: /health and /metrics (open), /v1/models, /v1/completions and /v1/chat/completions.
Each generation route validates, builds the prompt tokens, admits the request and responds."""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.llm_engine import LLMEngine
from llmopt.server.admission import Admission
from llmopt.server.errors import APIError
from llmopt.server.metrics import ServerMetrics
from llmopt.server.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_ENGINE_REQUESTS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    SamplingRequest,
    TokenizeRequest,
)
from llmopt.server.responses import CHAT_COMPLETION, TEXT_COMPLETION, respond
from llmopt.server.settings import ServerSettings


def build_router(
    engine: LLMEngine, engine_thread: EngineThread, metrics: ServerMetrics, settings: ServerSettings
) -> APIRouter:
    routes = Routes(
        engine,
        engine_thread,
        metrics,
        settings,
        Admission(engine, engine_thread, metrics, settings.max_queue_len),
    )
    router = APIRouter()
    router.add_api_route("/health", routes.health, methods=["GET"])
    router.add_api_route("/metrics", routes.prometheus_metrics, methods=["GET"])
    router.add_api_route("/v1/models", routes.models, methods=["GET"])
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"])
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"])
    router.add_api_route("/reset_prefix_cache", routes.reset_prefix_cache, methods=["POST"])
    router.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    router.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    return router


@dataclass(frozen=True)
class Routes:
    engine: LLMEngine
    engine_thread: EngineThread
    metrics: ServerMetrics
    settings: ServerSettings
    admission: Admission
    # Tokenizing and chat templating run here, off the event loop: a long prompt must not stall every
    # other stream. One worker, because the engine thread decodes with the same tokenizer and one
    # encoder at a time is what the tokenizer's Rust core is safe with.
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="llmopt-tokenize")
    )

    async def health(self) -> Response:
        """200 while the engine steps; 503 once a step has failed or the server is stopping (a load
        balancer or orchestrator should then route elsewhere or restart it)."""
        if self.engine_thread.healthy:
            return JSONResponse({"status": "ok"})
        reason = self.engine_thread.failure or "shutting down"
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)

    async def prometheus_metrics(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def models(self) -> dict:
        model = {
            "id": self.settings.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llmopt",
            "max_model_len": self.engine.max_model_len,
        }
        return {"object": "list", "data": [model]}

    async def tokenize(self, req: TokenizeRequest) -> dict:
        """vLLM's shape: {"count", "max_model_len", "tokens"}."""
        self.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        if req.messages is not None:
            tokens = await self.off_loop(self.chat_prompt, chat_messages(req.messages))
        else:
            tokenizer = self.engine.tokenizer
            encode = functools.partial(tokenizer.encode, add_special_tokens=req.add_special_tokens)
            tokens = await self.off_loop(encode, req.prompt)
        return {"count": len(tokens), "max_model_len": self.engine.max_model_len, "tokens": list(tokens)}

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        self.check_model(req.model)
        try:
            self.engine.check_token_ids(req.tokens)
        except ValueError as exc:
            raise APIError(400, str(exc), param="tokens") from None
        return {"prompt": await self.off_loop(self.engine.tokenizer.decode, req.tokens)}

    async def reset_prefix_cache(self) -> Response:
        """Forget the prefix cache (as vLLM's endpoint): what a benchmark calls between points."""
        if not self.engine_thread.healthy:
            raise APIError(503, "the engine is not running", "server_error")
        await asyncio.wrap_future(self.engine_thread.call(self.engine.reset_prefix_cache))
        return Response(status_code=200)

    async def completions(self, req: CompletionRequest, request: Request) -> Response:
        self.check_common(req)
        if req.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        prompts = await self.off_loop(self.prompt_token_ids, req)
        max_tokens = req.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        group = self.admission.start(req, prompts, max_tokens)
        return await respond(req, group, TEXT_COMPLETION, self.settings.served_model_name, request)

    async def chat_completions(self, req: ChatCompletionRequest, request: Request) -> Response:
        self.check_common(req)
        prompt = await self.off_loop(self.chat_prompt, chat_messages(req.messages))
        group = self.admission.start(req, [prompt], req.max_completion_tokens or req.max_tokens)
        return await respond(req, group, CHAT_COMPLETION, self.settings.served_model_name, request)

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool, fn, *args)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        try:
            return self.engine.chat_token_ids(messages)
        except Exception as exc:  # the model's own chat template rejects the conversation
            raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages") from None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.served_model_name:
            raise APIError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")

    def check_common(self, req: SamplingRequest) -> None:
        self.check_model(req.model)
        if req.logprobs:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs")
        if (name := req.unsupported_field()) is not None:
            raise APIError(400, f"{name} is not supported by this server", param=name)

    def prompt_token_ids(self, req: CompletionRequest) -> list[list[int]]:
        """One token list per prompt, whichever of OpenAI's four prompt forms the request uses."""
        prompt = req.prompt
        count = 1 if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt) else len(prompt)
        if count * req.n > MAX_ENGINE_REQUESTS:  # refused before any tokenizing
            raise APIError(
                400, f"prompts x n may be at most {MAX_ENGINE_REQUESTS} in one request", param="prompt"
            )
        if isinstance(prompt, str):
            prompts = [self.engine.tokenize(prompt)]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self.engine.tokenize(p) for p in prompt]
        else:
            prompts = [list(p) for p in prompt]
        if not prompts or any(not p for p in prompts):
            raise APIError(400, "prompt must not be empty", param="prompt")
        return prompts


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the chat template takes them; a content part that is not text is a 400."""
    for i, message in enumerate(messages):
        if (kind := message.non_text_part()) is not None:
            raise APIError(
                400,
                f"content parts of type {kind!r} are not supported: this server reads text only",
                param=f"messages[{i}].content",
            )
    return [{"role": m.role, "content": m.text()} for m in messages]
