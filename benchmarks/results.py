"""Where every benchmark writes its JSON: results/ at the top of the checkout (git-ignored)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"


def write_result(name: str, data: dict) -> Path:
    """Write `data` as results/<name>.json and return the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
