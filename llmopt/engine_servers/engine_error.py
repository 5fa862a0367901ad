"""The one error of this room: a serve setting an engine cannot honour, or an engine not installed."""

from __future__ import annotations


class EngineError(Exception):
    """The message names the flag (or the missing piece) and says what to do."""
