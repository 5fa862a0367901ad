"""Secrets stay out of run folders: an API key is replaced by REDACTED wherever a setting, a server's
arguments or an error message is recorded (summary.json, summary.csv, requests.jsonl, the report)."""

from __future__ import annotations

REDACTED = "***"


def is_api_key_arg(name: str) -> bool:
    """Whether a `[[serve]]` argument is the server's API key (`api-key` or `api_key`)."""
    return name.replace("_", "-") == "api-key"


def redact_args(args: dict | None) -> dict | None:
    """Server arguments as they may be recorded: the API key's value replaced."""
    if args is None:
        return None
    return {k: REDACTED if is_api_key_arg(k) else v for k, v in args.items()}


def redact_text(text: str, secret: str | None) -> str:
    """`text` without `secret` in it (a server may echo the key it was sent in an error message)."""
    return text.replace(secret, REDACTED) if secret else text
