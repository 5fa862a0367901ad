"""The HTTP routes: /health and /metrics (open), /v1/models, /v1/completions and /v1/chat/completions,
the tokenizer routes, the admin route (/reset_prefix_cache, unless turned off), and the Responses and
Messages APIs (responses_api.py, messages_api.py), which translate into chat's path (`start_chat`). Each
generation route validates, builds the prompt tokens, admits the request and responds."""

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
from llmopt.server.chat_call import ChatCall, StartedChat
from llmopt.server.error_bodies import APIError, renamed
from llmopt.server.logprobs import LogprobsWriter, TokenTexts
from llmopt.server.messages_api import MessagesAPI
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
from llmopt.server.response_store import ResponseStore
from llmopt.server.responses import CHAT_COMPLETION, TEXT_COMPLETION, respond
from llmopt.server.responses_api import ResponsesAPI
from llmopt.server.settings import ServerSettings
from llmopt.server.structured_outputs import compile_output, requested_and_compiled, requested_output
from llmopt.server.tokenizer_info import tokenizer_info
from llmopt.server.tools import ToolChoice, constrained_output, template_handles_tools, template_messages


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
    responses = ResponsesAPI(routes, ResponseStore())
    messages = MessagesAPI(routes)
    router = APIRouter()
    router.add_api_route("/health", routes.health, methods=["GET"])
    router.add_api_route("/metrics", routes.prometheus_metrics, methods=["GET"])
    router.add_api_route("/v1/models", routes.models, methods=["GET"])
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"])
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"])
    router.add_api_route("/tokenizer_info", routes.tokenizer_info, methods=["GET"])
    if not settings.disable_admin_routes:
        router.add_api_route("/reset_prefix_cache", routes.reset_prefix_cache, methods=["POST"])
    router.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    router.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    router.add_api_route("/v1/responses", responses.create, methods=["POST"])
    router.add_api_route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"])
    router.add_api_route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"])
    router.add_api_route("/v1/messages", messages.create, methods=["POST"])
    router.add_api_route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"])
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

    async def tokenizer_info(self) -> dict:
        """vLLM's /tokenizer_info (tokenizer_info.py)."""
        return tokenizer_info(self.engine.tokenizer, self.engine.max_model_len)

    async def tokenize(self, req: TokenizeRequest) -> dict:
        """vLLM's shape: {"count", "max_model_len", "tokens"}."""
        self.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        if req.messages is not None:
            tokens = await self.off_loop(self.chat_prompt, req.messages, ToolChoice.of(req.tools))
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
        if req.max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens must be at least 1 (0 only with echo)", param="max_tokens")
        prompts = await self.off_loop(self.prompt_token_ids, req)
        echo = await self.off_loop(self.echo_texts, req, prompts) if req.echo else None
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        structured_output = await requested_and_compiled(self.engine, req)
        group = self.admission.start(req, prompts, max_tokens, structured_output)
        logprobs = self.logprobs_writer(req, echo)
        return await respond(
            req, group, TEXT_COMPLETION, self.settings.served_model_name, request, logprobs=logprobs
        )

    async def chat_completions(self, req: ChatCompletionRequest, request: Request) -> Response:
        started = await self.start_chat(ChatCall(req))
        logprobs = self.logprobs_writer(req, chat_echo(req))
        model = self.settings.served_model_name
        return await respond(req, started.group, CHAT_COMPLETION, model, request, started.parser, logprobs)

    async def start_chat(self, call: ChatCall) -> StartedChat:
        """The one path of every chat-shaped API into the engine: checked, templated, admitted. An
        error names the field in the words of the API that translated the request (`call.names`)."""
        try:
            return await self._start_chat(call)
        except APIError as exc:
            raise renamed(exc, call.names) from None

    async def _start_chat(self, call: ChatCall) -> StartedChat:
        req = call.request
        self.check_common(req)
        tools = ToolChoice.of(req.tools, req.tool_choice, req.parallel_tool_calls)
        requested = call.requested or requested_output(req)
        structured_output = constrained_output(requested.output if requested else None, tools)
        if structured_output is not None:  # compiled off the event loop; errors name the field that asked
            param = requested.param if requested and requested.output == structured_output else "tools"
            structured_output = await compile_output(self.engine, structured_output, param)
        prompt = await self.off_loop(self.chat_prompt, req.messages, tools)
        max_tokens = req.max_completion_tokens or req.max_tokens
        group = self.admission.start(req, [prompt], max_tokens, structured_output)
        parser = tools.parser if tools is not None else None
        return StartedChat(group, parser, len(prompt))

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool, fn, *args)

    def chat_prompt(self, messages: list[ChatMessage], tools: ToolChoice | None) -> list[int]:
        chat_template = getattr(self.engine.tokenizer, "chat_template", None)
        if not chat_template:  # a base model: transformers' own message points at its docs instead
            raise APIError(
                400,
                f"the model '{self.settings.served_model_name}' has no chat template (it is a base "
                "model), so it cannot take messages: send a prompt to /v1/completions instead",
                param="messages",
            )
        native = template_handles_tools(chat_template)
        conversation = chat_messages(messages, tools, native)
        template_tools = tools.template_tools() if native and tools is not None else None
        try:
            return self.engine.chat_token_ids(conversation, template_tools)
        except Exception as exc:  # the model's own chat template rejects the conversation
            raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages") from None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.served_model_name:
            raise APIError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")

    def check_common(self, req: SamplingRequest) -> None:
        self.check_model(req.model)
        if (name := req.unsupported_field()) is not None:
            raise APIError(400, f"{name} is not supported by this server", param=name)
        if isinstance(req, ChatCompletionRequest) and req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        if req.prompt_logprobs is not None and req.stream:  # as vLLM: a stream has nowhere to put them
            raise APIError(
                400, "prompt_logprobs are not available when stream is true", param="prompt_logprobs"
            )

    @functools.cached_property
    def token_texts(self) -> TokenTexts:
        return TokenTexts(self.engine.tokenizer)

    def logprobs_writer(self, req: SamplingRequest, echo: list[str] | None = None) -> LogprobsWriter | None:
        """What writes the choices' logprobs, prompt_logprobs and echo's text (None when none is asked
        for)."""
        wanted = req.num_logprobs() is not None
        if not wanted and echo is None and req.prompt_logprobs is None:
            return None
        legacy = isinstance(req, CompletionRequest)
        return LogprobsWriter(
            self.token_texts, legacy, wanted, echo, req.num_logprobs(), prompt_top=req.prompt_logprobs
        )

    def echo_texts(self, req: CompletionRequest, prompts: list[list[int]]) -> list[str]:
        """Each choice's prompt as echo shows it: text as it was sent, token ids decoded (special tokens
        kept, so that the text matches its tokens' logprobs)."""
        prompt = req.prompt
        if isinstance(prompt, str):
            texts = [prompt]
        elif all(isinstance(p, str) for p in prompt):
            texts = list(prompt)
        else:
            texts = [self.decode_prompt(ids) for ids in prompts]
        return [text for text in texts for _ in range(req.n)]

    def decode_prompt(self, token_ids: list[int]) -> str:
        try:
            self.engine.check_token_ids(token_ids)
        except ValueError:
            return ""  # admission refuses the request (a 400 naming the prompt) before anything is sent
        decode = self.engine.tokenizer.decode
        return decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

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


def chat_echo(req: ChatCompletionRequest) -> list[str] | None:
    """vLLM's chat echo: each choice starts with the last message's content when that message is the
    assistant's, the role of the answer (this server always opens a new assistant turn); else with
    nothing. None without echo."""
    if not req.echo:
        return None
    last = req.messages[-1]
    return [last.text() if last.role == "assistant" else ""] * req.n


def chat_messages(
    messages: list[ChatMessage], tools: ToolChoice | None = None, native: bool = False
) -> list[dict]:
    """The messages as the chat template takes them, with tools and earlier tool calls and results
    (tools.py says how); a content part that is not text is a 400."""
    for i, message in enumerate(messages):
        if (kind := message.non_text_part()) is not None:
            raise APIError(
                400,
                f"content parts of type {kind!r} are not supported: this server reads text only",
                param=f"messages[{i}].content",
            )
    return template_messages(messages, tools, native)
