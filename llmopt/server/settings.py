"""What `llmopt serve` is told about the API it serves, apart from the engine itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None  # None: /v1 is open to anyone who can reach the port
    max_queue_len: int | None = None  # None: no limit on requests waiting to be scheduled
