"""One request of a workload, as the workloads make it and the load wing sends it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BenchRequest:
    """One request of a workload. `prompt_tokens` is the local tokenizer's count."""

    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int = 128
    prompt_tokens: int = 0
    tools: list[dict] | None = None  # OpenAI tool definitions, sent as `tools` (chat only)
    # OpenAI's `response_format` ({"type": "json_schema", "json_schema": {...}} or {"type": "json_object"}):
    # the answer is checked against it (structured_answer.py)
    response_format: dict | None = None
    # The Responses API: the turn this one continues (its `messages` then hold only the new turn), and
    # whether the server should keep this answer for a later turn to continue.
    previous_response_id: str | None = None
    store: bool = False
