"""What `llmopt serve` is told about the API it serves, apart from the engine itself. Its values come
from the serve options (engine_servers/options.py, where their defaults are written)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    # Waiting requests beyond this are answered 429 at once rather than queued for minutes; None: no
    # limit. At 16 running sequences of ~100 ms a token, 256 waiting is already a long wait.
    max_queue_len: int | None
    max_request_bytes: int  # a larger body is answered 413 before it is parsed
    api_key: str | None = None  # None: every route is open to anyone who can reach the port
    api_key_env: str | None = None  # the variable the key was read from, named in the start-up hint
    disable_log_requests: bool = False  # no access-log line per request (engine_servers/options.py)
    disable_admin_routes: bool = False  # no /reset_prefix_cache (engine_servers/options.py)
