"""One choice's engine outputs as API-neutral deltas: the content text and tool-call pieces the choice's
parser lets out so far (tool_parsers.py), and at the end its finish reason and usage. The Responses and
Messages APIs each write their events (or their whole body) from this one stream, so their streams and
bodies carry the same text and calls as chat's by construction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from llmopt.server.request_group import RequestGroup
from llmopt.server.responses import ResponseUsage, ended_early, tool_finish_reason
from llmopt.server.tool_parsers import ChoiceParser, Piece


@dataclass(frozen=True)
class Delta:
    pieces: list[Piece]  # content (str) and tool-call pieces, in order
    finish_reason: str | None = None  # the last delta's: "stop", "length" or "tool_calls"
    usage: ResponseUsage | None = None  # the last delta's
    text: str = ""  # the engine's text behind the pieces, as generated (the parser's input)
    token_ids: list[int] = field(default_factory=list)  # the tokens behind it


async def choice_deltas(
    group: RequestGroup, parser: Callable[[], ChoiceParser | None] | None
) -> AsyncIterator[Delta]:
    """The deltas of the group's one choice (these APIs have no `n`); an engine abort or this request's
    failure raises its APIError (each writer turns it into its API's error event)."""
    reader = parser() if parser is not None else None
    usage = ResponseUsage()
    async for index, out in group.outputs():
        if out.finished and (error := ended_early(out, group)) is not None:
            raise error
        usage.add(out, index, group.n_per_prompt)
        if reader is None:
            pieces: list[Piece] = [out.new_text] if out.new_text else []
        else:
            pieces = reader.feed(out.new_text) + (reader.finish() if out.finished else [])
        if not out.finished:
            if pieces or out.new_token_ids:  # held-back text still counts its tokens
                yield Delta(pieces, text=out.new_text, token_ids=out.new_token_ids)
            continue
        finish = tool_finish_reason(out.finish_reason, reader) if reader else out.finish_reason
        yield Delta(pieces, finish, usage, out.new_text, out.new_token_ids)
