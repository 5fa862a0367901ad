"""The APIs the bench speaks, by name, and what reading one event (or one whole answer) of the newer
two gives the client (responses_wire.py, messages_wire.py); chat's and completions' chunks are read in
client.py. Every API's usage is handed over in chat's shape, so records, summaries and the cost model
read cached input the same way whichever API served it."""

from __future__ import annotations

from dataclasses import dataclass

# Each API's route under the endpoint's base (…/v1).
API_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "messages": "/messages",
}
APIS = tuple(API_PATHS)
# The APIs a conversation can be sent through (completions takes a prompt, not messages).
SESSION_APIS = ("chat", "responses", "messages")


class WireError(Exception):
    """An answer says its request failed, or is not the API's shape; the message is the record's error."""


@dataclass(frozen=True)
class WireEvent:
    """What one event of a stream (or one whole answer) adds to a request's record."""

    text: str = ""  # output text (a tool call's name and argument pieces count as output)
    usage: dict | None = None  # in chat's shape: prompt_tokens, completion_tokens, prompt_tokens_details
    finish_reason: str | None = None  # chat's words: stop, length, tool_calls
    response_id: str | None = None  # what a chained turn names as its previous response
    done: bool = False  # the answer's last event
