"""Request traces in the Mooncake format (kvcache-ai/Mooncake, FAST'25 traces): JSONL, one request a
line, {"timestamp": ms since the trace's start, "input_length": tokens, "output_length": tokens,
"hash_ids": [ints]}. Each hash id stands for one block of `block_size` prompt tokens (Mooncake's traces
use 512) that is the same wherever the id appears, so requests that share leading ids share a prefix.
`hash_ids` may be left out (no shared blocks). A bad line is a ValueError naming `path:line`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.files import jsonl_records


@dataclass
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int] = field(default_factory=list)


def read_trace(path: Path) -> list[TraceEntry]:
    """The trace's requests, in file order; timestamps must not go backwards."""
    if not path.is_file():
        raise ValueError(f"trace file not found: {path}")
    entries: list[TraceEntry] = []
    for number, item in jsonl_records(path, path.read_text()):
        try:
            entry = trace_entry(item)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        if entries and entry.timestamp_ms < entries[-1].timestamp_ms:
            raise ValueError(
                f"{path}:{number}: timestamp {entry.timestamp_ms:g} is before the previous line's "
                f"{entries[-1].timestamp_ms:g} (a trace is in arrival order)"
            )
        entries.append(entry)
    if not entries:
        raise ValueError(f"{path} holds no requests")
    return entries


def trace_entry(item: object) -> TraceEntry:
    """One line's request; ValueError saying which field is wrong."""
    if not isinstance(item, dict):
        raise ValueError('a line is a JSON object {"timestamp", "input_length", "output_length", "hash_ids"}')
    for name in ("timestamp", "input_length", "output_length"):
        if name not in item:
            raise ValueError(f'missing "{name}"')
    timestamp = item["timestamp"]
    if not is_number(timestamp) or timestamp < 0:
        raise ValueError(f'"timestamp" is milliseconds, a number >= 0, not {timestamp!r}')
    lengths = [item["input_length"], item["output_length"]]
    for name, value in zip(("input_length", "output_length"), lengths):
        if not is_number(value) or value != int(value) or value < 1:
            raise ValueError(f'"{name}" is a number of tokens, a whole number >= 1, not {value!r}')
    hash_ids = item.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(is_number(h) and h == int(h) for h in hash_ids):
        raise ValueError(f'"hash_ids" is a list of whole numbers, not {str(hash_ids)[:80]}')
    return TraceEntry(float(timestamp), int(lengths[0]), int(lengths[1]), [int(h) for h in hash_ids])


def is_number(value: object) -> bool:
    """A finite JSON number (JSON parsing here lets NaN and Infinity through)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def send_times(entries: list[TraceEntry]) -> list[float]:
    """Each request's send time in seconds after the first one's (a trace may start at any clock)."""
    start = entries[0].timestamp_ms
    return [(e.timestamp_ms - start) / 1000 for e in entries]
