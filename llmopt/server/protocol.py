"""Pydantic schemas of the OpenAI API subset llmopt serves (plus vLLM's ignore_eos / min_tokens), with
the bounds a production server needs on what one request may ask for."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 16
# One request may not make the engine thread do unbounded work per token: stop strings are searched for
# after every token, and prompts x n become that many engine requests.
MAX_STOP_SEQUENCES = 16
MAX_STOP_LENGTH = 256  # characters
MAX_STOP_TOKEN_IDS = 1024
MAX_ENGINE_REQUESTS = 256  # prompts x n of one HTTP request
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI bounds it
MAX_LEGACY_LOGPROBS = 5  # completions' logprobs, as OpenAI bounds it
MAX_TOKEN_ID_DIGITS = 10  # a logit_bias key longer than this is no token id (and int() of it is slow)
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]  # frequency and presence (OpenAI)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat: the rest of the context)
# OpenAI's limits on tools: at most 128 functions, names of 1-64 letters, digits, '_' or '-' (so a name
# needs no escaping in the prompt or in the grammar that constrains a call).
MAX_TOOLS = 128
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

# OpenAI fields this server does not honour, with the values that ask for nothing (and so are accepted).
# Anything else is a 400 naming the field: a client must not believe it got JSON mode or a penalty.
# Only undeclared fields are looked up here, so a field a request model declares (ChatCompletionRequest's
# tools, tool_choice, parallel_tool_calls) is honoured there and still refused by /v1/completions.
UNSUPPORTED_FIELDS: dict[str, tuple] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


def checked_stop_strings(strings: list[str] | None) -> list[str] | None:
    """Stop strings within the bounds above (a field validator's ValueError otherwise)."""
    if len(strings or []) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop strings")
    for s in strings or []:
        if not s:
            raise ValueError("stop strings must not be empty")
        if len(s) > MAX_STOP_LENGTH:
            raise ValueError(f"stop strings may be at most {MAX_STOP_LENGTH} characters")
    return strings


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by both endpoints. Unknown fields are kept aside (`unsupported_field` looks at them)
    and otherwise ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    # Penalties and bias (engine/penalties.py) and min_p, with OpenAI's and vLLM's bounds; null: off.
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # vLLM's extra: each prompt token's logprob and rank, with the k most likely tokens at its position
    # (bounded as vLLM's default --max-logprobs bounds it); not available on a stream, as in vLLM.
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_maps_token_ids_to_bounded_values(cls, bias: dict[str, float] | None) -> dict | None:
        for key, value in (bias or {}).items():
            # Plain ASCII digits only: int() would also take " 5", "+5", "5_0" and other scripts' digits.
            if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
                raise ValueError(f"keys must be token ids, got {key[:20]!r}")
            if not -100 <= value <= 100:  # NaN fails this too
                raise ValueError(f"values must be in [-100, 100], got {value} for token {key}")
        return bias

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def num_logprobs(self) -> int | None:
        """How many of the most likely tokens each output token's logprobs list (None: no logprobs)."""
        return None

    def num_prompt_logprobs(self) -> int | None:
        """The same for each prompt token (None: the prompt is not scored)."""
        return self.prompt_logprobs

    @field_validator("stop")
    @classmethod
    def _stop_strings_are_searchable(cls, stop: str | list[str] | None) -> str | list[str] | None:
        checked_stop_strings([stop] if isinstance(stop, str) else stop)
        return stop

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def unsupported_field(self) -> str | None:
        """The first field the request sets that this server does not honour (None: all honoured)."""
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED_FIELDS.items():
            if name in extra and not any(extra[name] == value for value in neutral):
                return name
        if self.stream_options is not None and not self.stream:
            return "stream_options"  # only meaningful for a stream, as OpenAI says
        return None


class CompletionRequest(SamplingRequest):
    prompt: Annotated[str, Field(min_length=1)] | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=0)] | None = None  # 0 only with echo: the prompt is scored
    echo: bool = False  # the text starts with the prompt (and with logprobs, the prompt's logprobs too)
    logprobs: Annotated[int, Field(ge=0, le=MAX_LEGACY_LOGPROBS)] | None = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        """The most that echo's logprobs and `prompt_logprobs` ask for (each view keeps its own)."""
        echoed = None
        if self.echo:
            # Echo with max_tokens 0 scores the prompt even without logprobs: that is its only work.
            echoed = self.logprobs if self.logprobs is not None else 0 if self.max_tokens == 0 else None
        wanted = [k for k in (echoed, self.prompt_logprobs) if k is not None]
        return max(wanted) if wanted else None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str  # JSON text, as OpenAI sends it (tools.py checks that it parses)


class MessageToolCall(BaseModel):
    """A tool call of an earlier assistant turn, replayed by the client."""

    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call this result answers
    name: str | None = None

    def non_text_part(self) -> str | None:
        """The type of the first content part that is not text (this server reads text only)."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if part.type != "text"), None)
        return None

    def text(self) -> str:
        if isinstance(self.content, list):  # OpenAI's content parts, all of them text
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of type object (tools.py checks it); None: no arguments
    strict: bool | None = None  # calls are constrained (required, named) or parsed (auto) either way


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


Tools = Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)]


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a prompt, or messages (and tools) under the chat template."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: Tools | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # needs logprobs: true
    tools: Tools | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # None: auto
    parallel_tool_calls: bool = True
    # vLLM's extra: the answer starts with the last message's content when that message is the
    # assistant's (the turn being continued).
    echo: bool = False

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
