"""What `llmopt serve` is told about the API it serves, apart from the engine itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None  # None: /v1 is open to anyone who can reach the port
    # Waiting requests beyond this are answered 429 at once rather than queued for minutes; None: no
    # limit. At 16 running sequences of ~100 ms a token, 256 waiting is already a long wait.
    max_queue_len: int | None = 256
    max_request_bytes: int = 4 * 2**20  # a larger body is answered 413 before it is parsed
