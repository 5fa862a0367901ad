"""The OpenAI-compatible HTTP API over the engine: /v1/models, /v1/completions, /v1/chat/completions,
/health and /metrics. The engine steps on its own thread (EngineThread); each HTTP request reads its
outputs from an asyncio queue."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.llm_engine import LLMEngine
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import RequestOutput
from llmopt.server.metrics import ServerMetrics
from llmopt.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest


@dataclass
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_queue_len: int | None = None


class APIError(Exception):
    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class RequestGroup:
    """The engine requests behind one HTTP request (every prompt times n), read from one queue.

    Leaving `outputs()` early (a client that went away, an error) aborts what is still running, so
    its KV blocks go back to the pool.
    """

    def __init__(
        self,
        engine_thread: EngineThread,
        metrics: ServerMetrics,
        prompts: list[list[int]],
        params: list[SamplingParams],
        n_per_prompt: int,
    ):
        self.engine_thread = engine_thread
        self.n_per_prompt = n_per_prompt  # choices i*n .. i*n+n-1 share prompt i
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self.start = time.perf_counter()
        base = uuid.uuid4().hex
        self.request_ids = [f"{base}-{i}" for i in range(len(prompts))]
        self.unfinished = set(range(len(prompts)))
        loop = asyncio.get_running_loop()
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                engine_thread.add_request(prompt, p, self.request_ids[i], self._sink(loop, i))
        except (ValueError, RuntimeError):
            self.abort()
            raise

    def _sink(self, loop: asyncio.AbstractEventLoop, index: int):
        def put(output: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, output))

        return put

    def abort(self) -> None:
        for i in self.unfinished:
            self.engine_thread.abort(self.request_ids[i])

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        last_token_time = {i: None for i in self.unfinished}
        try:
            while self.unfinished:
                index, output = await self.queue.get()
                now = time.perf_counter()
                if output.new_token_ids:
                    previous = last_token_time[index]
                    if previous is None:
                        self.metrics.ttft.observe(now - self.start)
                    else:
                        self.metrics.itl.observe(now - previous)
                    last_token_time[index] = now
                if output.finished:
                    self.unfinished.discard(index)
                    self.metrics.e2e.observe(now - self.start)
                yield index, output
        finally:
            self.abort()


def create_app(engine: LLMEngine, settings: ServerSettings) -> FastAPI:
    engine_thread = EngineThread(engine)
    metrics = ServerMetrics(engine, settings.served_model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_thread.start()
        yield
        engine_thread.shutdown()

    app = FastAPI(title="llmopt", lifespan=lifespan)
    app.state.engine_thread = engine_thread

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return APIError(400, f"the request body is not valid JSON: {first.get('msg')}").response()
        where = ".".join(loc) or "body"
        return APIError(400, f"{where}: {first.get('msg')}", param=loc[-1] if loc else None).response()

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if settings.api_key and request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "")
            expected = f"Bearer {settings.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return APIError(
                    401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
                ).response()
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "llmopt",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    def aborted_error() -> APIError:
        """Why the engine ended a request early: a shutdown, or (a bug) a failed engine step."""
        if engine_thread.stopping:
            return APIError(503, "the server is shutting down; the request was not completed", "server_error")
        return APIError(
            500, "the engine failed while serving this request; see the server log", "server_error"
        )

    def check_common(req: SamplingRequest) -> None:
        if req.model is not None and req.model != settings.served_model_name:
            raise APIError(
                404, f"the model '{req.model}' does not exist", param="model", code="model_not_found"
            )
        if req.logprobs:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs")

    def sampling_params(
        req: SamplingRequest, max_tokens: int | None, prompt_len: int, index: int
    ) -> SamplingParams:
        if max_tokens is None:
            max_tokens = engine.max_model_len - prompt_len
            if max_tokens < 1:
                raise APIError(
                    400,
                    f"this model's maximum context length is {engine.max_model_len} tokens; "
                    f"the prompt has {prompt_len}",
                    param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                )
        if req.min_tokens > max_tokens:
            raise APIError(400, "min_tokens must not exceed max_tokens", param="min_tokens")
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
        )

    def start_group(req: SamplingRequest, prompts: list[list[int]], max_tokens: int | None) -> RequestGroup:
        expanded = [p for p in prompts for _ in range(req.n)]
        params = [sampling_params(req, max_tokens, len(p), i % req.n) for i, p in enumerate(expanded)]
        if (
            settings.max_queue_len is not None
            and engine.num_waiting() + len(expanded) > settings.max_queue_len
        ):
            raise APIError(
                429,
                f"the server's queue is full ({settings.max_queue_len} waiting requests); retry later",
                "rate_limit_error",
                code="queue_full",
            )
        try:
            return RequestGroup(engine_thread, metrics, expanded, params, req.n)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        except RuntimeError as exc:
            raise APIError(503, str(exc), "server_error") from None

    async def respond(req: SamplingRequest, group: RequestGroup, chat: bool) -> Response:
        kind = "chat.completion" if chat else "text_completion"
        response_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return StreamingResponse(
                stream(group, response_id, created, chat, include_usage), media_type="text/event-stream"
            )
        texts = [""] * len(group.request_ids)
        finish = [None] * len(group.request_ids)
        prompt_tokens = completion_tokens = cached_tokens = 0
        async for index, out in group.outputs():
            texts[index] += out.new_text
            if out.finished:
                if out.finish_reason == "abort":
                    raise aborted_error()
                finish[index] = out.finish_reason
                completion_tokens += out.output_tokens
                if index % group.n_per_prompt == 0:  # a prompt shared by n choices counts once
                    prompt_tokens += out.prompt_tokens
                    cached_tokens += out.cached_tokens
        if chat:
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": t},
                    "logprobs": None,
                    "finish_reason": f,
                }
                for i, (t, f) in enumerate(zip(texts, finish))
            ]
        else:
            choices = [
                {"index": i, "text": t, "logprobs": None, "finish_reason": f}
                for i, (t, f) in enumerate(zip(texts, finish))
            ]
        return JSONResponse(
            {
                "id": response_id,
                "object": kind,
                "created": created,
                "model": settings.served_model_name,
                "choices": choices,
                "usage": usage_dict(prompt_tokens, completion_tokens, cached_tokens),
            }
        )

    async def stream(
        group: RequestGroup, response_id: str, created: int, chat: bool, include_usage: bool
    ) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        n = len(group.request_ids)

        def chunk(choices: list[dict], usage: dict | None = None) -> str:
            body = {
                "id": response_id,
                "object": kind,
                "created": created,
                "model": settings.served_model_name,
            }
            body["choices"] = choices
            if include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        def choice(index: int, text: str, finish_reason: str | None, first: bool = False) -> dict:
            if chat:
                delta = (
                    {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                )
                return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

        if chat:
            yield chunk([choice(i, "", None, first=True) for i in range(n)])
        prompt_tokens = completion_tokens = cached_tokens = 0
        async for index, out in group.outputs():
            if out.finished and out.finish_reason == "abort":
                error = aborted_error()
                yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.type}})}\n\n"
                yield "data: [DONE]\n\n"
                return
            if out.new_text or out.finished:
                yield chunk([choice(index, out.new_text, out.finish_reason if out.finished else None)])
            if out.finished:
                completion_tokens += out.output_tokens
                if index % group.n_per_prompt == 0:
                    prompt_tokens += out.prompt_tokens
                    cached_tokens += out.cached_tokens
        if include_usage:
            yield chunk([], usage_dict(prompt_tokens, completion_tokens, cached_tokens))
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        check_common(req)
        if req.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        prompt = req.prompt
        if isinstance(prompt, str):
            prompts = [engine.tokenize(prompt)]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [engine.tokenize(p) for p in prompt]
        else:
            prompts = [list(p) for p in prompt]
        if not prompts or any(not p for p in prompts):
            raise APIError(400, "prompt must not be empty", param="prompt")
        group = start_group(req, prompts, req.max_tokens)
        return await respond(req, group, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest) -> Response:
        check_common(req)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            prompt = engine.chat_token_ids(messages)
        except Exception as exc:  # the model's own chat template rejects the conversation
            raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages") from None
        group = start_group(req, [prompt], req.max_completion_tokens or req.max_tokens)
        return await respond(req, group, chat=True)

    return app
