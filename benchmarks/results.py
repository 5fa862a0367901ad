"""Where every benchmark writes its JSON: results/ at the top of the checkout, with where it came from
(the command, the commit, the date, the CPU and its vector flags, the cores), so that a figure names the
machine it was measured on, and the tables the run printed, as plain text cells, so that
benchmarks/figures.py renders the pages of docs/figures/ from the JSON alone (no figure typed by hand)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table
from rich.text import Text

RESULTS = Path(__file__).resolve().parent.parent / "results"
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")


def cpu() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("flags\t\t", fields.get("flags", "")).split())
    model = next((v.strip() for k, v in fields.items() if k.strip() == "model name"), platform.processor())
    return {"model": model, "vector_flags": [f for f in VECTOR_FLAGS if f in flags], "cores": os.cpu_count()}


UNMEASURED = (":!results", ":!docs", ":!README.md")


def provenance() -> dict:
    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], capture_output=True, text=True, cwd=RESULTS.parent)
        return run.stdout.strip()

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git("rev-parse", "--short", "HEAD")
        # The earlier figures a rerun replaces (results/, docs/) are not changes to what is measured.
        + (
            " (with uncommitted changes)"
            if git("status", "--porcelain", "-uno", "--", ".", *UNMEASURED)
            else ""
        ),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu(),
    }


def plain_text(renderable: object) -> str:
    """A title, header or cell as the console shows it: a str cell is rich markup ("[red]3[/red]" prints
    as "3"), a Text already is what it shows."""
    if isinstance(renderable, Text):
        return renderable.plain
    if isinstance(renderable, str):
        return Text.from_markup(renderable).plain
    return str(renderable)


def table_data(table: Table) -> dict:
    """A printed rich Table as plain data: its title, column headers and alignments, rows of cell strings
    and caption (None where the table has none)."""
    cells_by_column = [[plain_text(cell) for cell in column._cells] for column in table.columns]
    return {
        "title": None if table.title is None else plain_text(table.title),
        "columns": [plain_text(column.header) for column in table.columns],
        "justify": [column.justify for column in table.columns],
        "rows": [list(row) for row in zip(*cells_by_column)],
        "caption": None if table.caption is None else plain_text(table.caption),
    }


def write_result(name: str, data: dict, tables: Sequence[Table] = ()) -> Path:
    """Write `data` with its provenance, and the `tables` the run printed, as results/<name>.json and
    return the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    stored = {"provenance": provenance()}
    if tables:
        stored["tables"] = [table_data(table) for table in tables]
    path.write_text(json.dumps({**stored, **data}, indent=2, default=str))
    return path
