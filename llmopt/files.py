"""Users' files as llmopt reads them: JSONL records and TOML documents, each error naming the file (and
the line), so a bad recipe, pricing table, prompt file or calibration file is one clear message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


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


def read_toml(path: Path, what: str = "file") -> dict:
    """The TOML document at `path`; a missing file or a syntax error is a ValueError naming it."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
