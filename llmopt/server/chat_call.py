"""The one internal chat request every API's edge translates into (chat completions, the Responses API,
Anthropic's Messages API), and what starting it gives back: the engine requests and the parser that
reads tool calls out of their text. There is one engine path; the APIs differ only in how they read a
request and write its deltas (deltas.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmopt.server.protocol import ChatCompletionRequest
from llmopt.server.request_group import RequestGroup
from llmopt.server.structured_outputs import RequestedOutput
from llmopt.server.tool_parsers import ChoiceParser


@dataclass(frozen=True)
class ChatCall:
    """Chat's own request (messages, tools, tool_choice, sampling, stream), the structured output asked
    for and the field that asked (None: what the chat request itself asks for), and the API's names for
    chat's fields, so that an error met on the way names the field the client sent."""

    request: ChatCompletionRequest
    requested: RequestedOutput | None = None
    names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StartedChat:
    group: RequestGroup
    parser: Callable[[], ChoiceParser | None] | None  # a fresh tool-call parser per choice; None: no tools
    prompt_tokens: int
