"""How the bench shows a server its API key: OpenAI's bearer header, on every request it sends (the
load, /models, /tokenize, /reset_prefix_cache)."""

from __future__ import annotations


def bearer_header(api_key: str | None) -> dict[str, str]:
    """{"Authorization": "Bearer KEY"}, or nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
