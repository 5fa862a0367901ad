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
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat: the rest of the context)

# OpenAI fields this server does not honour, with the values that ask for nothing (and so are accepted).
# Anything else is a 400 naming the field: a client must not believe it got JSON mode or a penalty.
UNSUPPORTED_FIELDS: dict[str, tuple] = {
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "top_logprobs": (None, 0),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
}


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
    logprobs: bool | int | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings_are_searchable(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop strings")
        for s in strings:
            if not s:
                raise ValueError("stop strings must not be empty")
            if len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"stop strings may be at most {MAX_STOP_LENGTH} characters")
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
    echo: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None

    def non_text_part(self) -> str | None:
        """The type of the first content part that is not text (this server reads text only)."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if part.type != "text"), None)
        return None

    def text(self) -> str:
        if isinstance(self.content, list):  # OpenAI's content parts, all of them text
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a prompt, or messages under the chat template."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
