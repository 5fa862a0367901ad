"""The Responses API's store: each stored response by its id, with its owner (a hash of the API key that
created it) and the conversation's items (its input, earlier turns' included, and its output), so that
`previous_response_id` rebuilds the conversation and a chained turn sends only its new items (the
prefix cache serves the rest). Bounded by count and by bytes; the least recently used goes first.

Lives on the event loop alone (every route is a coroutine), so it takes no lock."""

from __future__ import annotations

import hmac
import json
from collections import OrderedDict
from dataclasses import dataclass

# An agent session of 20 turns on a 2k-token context stores about 20 x 8 KiB of JSON; 1,000 responses
# or 64 MiB (whichever comes first) keep a few hundred such sessions without letting clients grow the
# server's memory without bound.
MAX_RESPONSES = 1000
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class StoredResponse:
    owner: str
    body: dict  # the response object as GET /v1/responses/{id} answers it
    items: list[dict]  # the conversation's items up to and including this response's output
    size: int  # bytes of the two as JSON: what the store's byte limit counts

    @classmethod
    def of(cls, owner: str, body: dict, items: list[dict]) -> StoredResponse:
        size = len(json.dumps(body, ensure_ascii=False)) + len(json.dumps(items, ensure_ascii=False))
        return cls(owner, body, items, size)


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def put(self, response_id: str, entry: StoredResponse) -> bool:
        """Store `entry`, evicting the least recently used until it fits; False (nothing stored, nothing
        evicted) when it alone is over the byte limit."""
        if entry.size > self.max_bytes:
            return False
        self.delete_entry(response_id)
        self.entries[response_id] = entry
        self.bytes += entry.size
        while len(self.entries) > self.max_responses or self.bytes > self.max_bytes:
            _, oldest = self.entries.popitem(last=False)
            self.bytes -= oldest.size
        return True

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The entry, if it exists and `owner` owns it (another key's entry is as absent as a missing
        one, so that ids reveal nothing); a read makes it the most recently used."""
        entry = self.entries.get(response_id)
        if entry is None or not hmac.compare_digest(entry.owner, owner):
            return None
        self.entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str, owner: str) -> bool:
        if self.get(response_id, owner) is None:
            return False
        self.delete_entry(response_id)
        return True

    def delete_entry(self, response_id: str) -> None:
        entry = self.entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
