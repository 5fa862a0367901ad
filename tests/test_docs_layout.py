"""The layout table in the docs matches the code (issue #39): every source file of the package is named
in docs/architecture.md, so a file added without its row fails here instead of going unmentioned.

A file counts as named when its file name appears in the doc inside backticks, alone (`loader.py`), as
the end of a path (`models/loader.py`, `llmopt/checkpoints.py`) or among other words in one code span.
`__init__.py` files are left out: a package's folder is its row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llmopt"
DOC = ROOT / "docs" / "architecture.md"
SUFFIXES = (".py", ".cpp", ".h", ".j2", ".toml")


def source_files(package: Path = PACKAGE) -> list[Path]:
    """Every file of the package the layout tables should name, relative to the package folder."""
    return sorted(
        path.relative_to(package)
        for path in package.rglob("*")
        if path.is_file()
        and path.name.endswith(SUFFIXES)
        and path.name != "__init__.py"
        and "__pycache__" not in path.parts
    )


def names_in_backticks(text: str) -> set[str]:
    """Each word of each code span, and the last part of each word that is a path."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in re.split(r"[\s,;()]+", span):
            if word:
                names.add(word)
                names.add(word.rstrip("/").rsplit("/", 1)[-1])
    return names


def missing_from(text: str, files: list[Path]) -> list[str]:
    named = names_in_backticks(text)
    return [str(path) for path in files if path.name not in named and str(path) not in named]


def test_every_source_file_is_named_in_the_architecture_doc():
    files = source_files()
    assert len(files) > 50, f"found only {len(files)} files under {PACKAGE}"
    missing = missing_from(DOC.read_text(), files)
    assert missing == [], (
        "files under llmopt/ not named in docs/architecture.md (add each to its package's layout table): "
        + ", ".join(missing)
    )


def test_a_file_left_out_of_the_doc_is_caught():
    files = [Path("bench/sweep/sweep.py"), Path("engine/models/loader.py"), Path("report/template.html.j2")]
    doc = "| `llmopt/bench/` | `sweep.py` (the sweep alone) |\n| `models/loader.py`, `other.py` | weights |\n"
    assert missing_from(doc, files) == ["report/template.html.j2"]
    unquoted = doc + "the template (template.html.j2, outside backticks)"
    assert missing_from(unquoted, files) == ["report/template.html.j2"]
