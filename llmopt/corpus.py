"""Text sources for workloads, calibration and evaluation: the default corpus, real English that every
Python install ships (the pydoc topics), so nothing needs downloading; and users' JSONL files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def default_text() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def jsonl_records(path: Path, text: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) for each non-blank line of a JSONL file's `text`; a line that is not
    JSON is a ValueError naming `path:line`."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
