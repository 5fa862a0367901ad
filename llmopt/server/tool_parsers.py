"""Reading tool calls out of generated text as it streams. Each choice's text goes through one parser,
which hands back what the client may see so far: content pieces and tool-call deltas in OpenAI's stream
shape. A whole response is the same pieces put together (`assemble`), so a stream and a JSON body
carry the same content and calls by construction.

Three parsers, one per tool_choice that reads calls: `MarkupParser` (auto: `<tool_call>{json}</tool_call>`
blocks in free text), `ArrayParser` (required: the grammar makes the text a JSON array of calls) and
`NamedParser` (a named function: the grammar makes the text that function's arguments)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Protocol

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class ToolCallDelta:
    """One piece of a call in OpenAI's stream shape: a call's first delta has its id and name."""

    index: int  # which call of the choice
    arguments: str  # (a piece of) the arguments' JSON text
    id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


Piece = str | ToolCallDelta  # a str is content


class ChoiceParser(Protocol):
    calls: int  # calls begun so far

    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def assemble(pieces: list[Piece]) -> tuple[str, list[dict]]:
    """The content and the calls (OpenAI's message.tool_calls) that a choice's pieces add up to."""
    content = "".join(p for p in pieces if isinstance(p, str))
    calls: list[dict] = []
    for p in pieces:
        if isinstance(p, ToolCallDelta) and p.id is not None:
            function = {"name": p.name, "arguments": p.arguments}
            calls.append({"id": p.id, "type": "function", "function": function})
        elif isinstance(p, ToolCallDelta):
            calls[p.index]["function"]["arguments"] += p.arguments
    return content, calls


def parse_call(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) of one {"name", "arguments"} object naming a declared function, else None."""
    try:
        call = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: brackets nested deeper than the parser goes
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or call["name"] not in names:
        return None
    # Some models write "parameters" (Llama's format) or the arguments as a JSON string, as OpenAI sends them.
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return call["name"], json.dumps(arguments, ensure_ascii=False)


def partial_open(text: str) -> int:
    """How many characters at the end of `text` could be the start of `<tool_call>`."""
    for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:k]):
            return k
    return 0


class MarkupParser:
    """tool_choice auto: `<tool_call>{json}</tool_call>` blocks become calls; the rest is content.
    Text that may be the start of a block is held back until it is known not to be one, and a block
    until it closes; a block whose JSON does not parse or that names no declared function stays content,
    as does a block that never closes. Whitespace between content and a call is not content, so a
    message that is only calls has no content; a plain answer comes out byte for byte."""

    def __init__(self, names: frozenset[str], parallel: bool = True):
        self.names, self.parallel = names, parallel
        self.calls = 0
        self.held = ""  # text not yet handed out
        self.in_block = False
        self.space = ""  # whitespace ending the content so far: dropped if a call follows
        self.after_call = False  # strip the whitespace that follows a call

    def feed(self, text: str) -> list[Piece]:
        self.held += text
        pieces: list[Piece] = []
        while True:
            if self.in_block:
                end = self.held.find(TOOL_CALL_CLOSE)
                if end < 0:
                    return pieces
                end += len(TOOL_CALL_CLOSE)
                block, self.held, self.in_block = self.held[:end], self.held[end:], False
                pieces += self._block(block)
                continue
            start = self.held.find(TOOL_CALL_OPEN)
            if start < 0:
                cut = len(self.held) - partial_open(self.held)
                pieces += self._content(self.held[:cut])
                self.held = self.held[cut:]
                return pieces
            pieces += self._content(self.held[:start])
            self.held, self.in_block = self.held[start:], True

    def finish(self) -> list[Piece]:
        pieces = self._content(self.held)
        self.held = ""
        if self.space and not self.after_call:  # a plain answer keeps its trailing whitespace
            pieces.append(self.space)
        self.space = ""
        return pieces

    def _block(self, block: str) -> list[Piece]:
        one_more = self.parallel or self.calls == 0
        call = (
            parse_call(block[len(TOOL_CALL_OPEN) : -len(TOOL_CALL_CLOSE)], self.names) if one_more else None
        )
        if call is None:
            return self._content(block)
        self.space, self.after_call = "", True
        name, arguments = call
        self.calls += 1
        return [ToolCallDelta(self.calls - 1, arguments, new_call_id(), name)]

    def _content(self, text: str) -> list[Piece]:
        if self.after_call:
            text = text.lstrip(WHITESPACE)
            self.after_call = not text
        text = self.space + text
        body = text.rstrip(WHITESPACE)
        self.space = text[len(body) :]
        return [body] if body else []


class ArrayParser:
    """tool_choice required: the grammar makes the text a JSON array of {"name", "arguments"} objects;
    each element becomes a call as soon as it is complete. Text that is no complete call (an array cut
    short by max_tokens) is content when the choice finishes."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.calls = 0
        self.text = ""
        self.pos: int | None = None  # where the next element may start, once '[' has been read
        self.decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Piece]:
        self.text += text
        if self.pos is None:
            rest = self.text.lstrip(WHITESPACE)
            if not rest.startswith("["):
                return []  # nothing yet, or not an array (then finish hands it out as content)
            self.pos = len(self.text) - len(rest) + 1
        pieces: list[Piece] = []
        while (start := self._next_element()) is not None:
            try:  # only a whole object decodes: a prefix of one is an error, so no call is cut
                _, end = self.decoder.raw_decode(self.text, start)
            except (ValueError, RecursionError):
                break
            call = parse_call(self.text[start:end], self.names)
            if call is None:  # the grammar rules this out; keep the text rather than lose it
                pieces.append(self.text[start:end])
            else:
                self.calls += 1
                pieces.append(ToolCallDelta(self.calls - 1, call[1], new_call_id(), call[0]))
            self.pos = end
        return pieces

    def finish(self) -> list[Piece]:
        if self.pos is None:
            return [self.text] if self.text else []
        rest = self.text[self.pos :].lstrip(WHITESPACE + ",")
        return [] if not rest.rstrip(WHITESPACE + "]") else [rest]  # nothing but the array's end

    def _next_element(self) -> int | None:
        """Where the next object starts (past whitespace and a comma), or None if none has begun."""
        assert self.pos is not None
        i = self.pos
        while i < len(self.text) and self.text[i] in WHITESPACE + ",":
            i += 1
        return i if self.text[i : i + 1] == "{" else None


class NamedParser:
    """A named function: the grammar makes the whole text the arguments, streamed as they come."""

    def __init__(self, name: str):
        self.name = name
        self.calls = 0

    def feed(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.calls == 0:
            self.calls = 1
            return [ToolCallDelta(0, text, new_call_id(), self.name)]
        return [ToolCallDelta(0, text)]

    def finish(self) -> list[Piece]:
        if self.calls == 0:  # no text at all: the call is still the one asked for
            self.calls = 1
            return [ToolCallDelta(0, "", new_call_id(), self.name)]
        return []
