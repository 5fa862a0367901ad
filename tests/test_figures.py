"""docs/figures/ and the README's headline table against the results JSON they are generated from
(benchmarks/figures.py, `make figures`): the committed pages must be what the committed JSON generates.
Also the printed rich Table as the JSON stores it, and the pages and headline table of small fake results."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from rich.table import Table
from rich.text import Text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # figures.py lives there

import figures  # noqa: E402

import results  # noqa: E402

RUN_MAKE_FIGURES = (
    "docs/figures/ or the README's headline table is not what results/*.json generates "
    "(differing: {}): run `make figures` and commit the pages with the JSON"
)
MARKED_README = (
    f"# llmopt\r\nintro\r\n{figures.HEADLINE_START}\nold table\n{figures.HEADLINE_END}\r\nrest\r\n"
)


def read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def regenerated_differences(results_dir: Path, figures_dir: Path, readme: Path, scratch: Path) -> list[str]:
    """Regenerate from results_dir into `scratch` (a copy of the README included) and name every page
    that differs from figures_dir, one missing from either side included, and the README."""
    scratch_readme = scratch / "README.md"
    shutil.copyfile(readme, scratch_readme)
    figures.write_figures(results_dir, scratch / "figures", scratch_readme)
    names = {p.name for p in (scratch / "figures").glob("*.md")} | {p.name for p in figures_dir.glob("*.md")}
    differing = [
        name for name in sorted(names) if read(scratch / "figures" / name) != read(figures_dir / name)
    ]
    pages = [f"docs/figures/{name}" for name in differing]
    return pages + (["README.md"] if read(scratch_readme) != read(readme) else [])


def test_committed_figures_are_what_the_committed_results_generate(tmp_path: Path) -> None:
    differing = regenerated_differences(figures.RESULTS, figures.FIGURES, figures.README, tmp_path)
    assert differing == [], RUN_MAKE_FIGURES.format(", ".join(differing))


def write_fake(
    results_dir: Path,
    name: str,
    tables: list[Table],
    load_start: float = 0.05,
    cpu: str = "Test CPU",
    flags: tuple[str, ...] = ("avx2", "fma"),
    extra: dict | None = None,
) -> None:
    """A results/<name>.json laid out as results.write_result writes it."""
    provenance = {
        "command": f"python benchmarks/{name}.py",
        "commit": "abc1234",
        "date": "2026-01-02 03:04 UTC",
    }
    provenance["cpu"] = {"model": cpu, "vector_flags": list(flags), "cores": 2}
    data = {
        "provenance": provenance,
        "tables": [results.table_data(table) for table in tables],
        "load_average_1min": {"start": load_start, "end": 1.25},
        **(extra or {}),
    }
    results_dir.mkdir(exist_ok=True)
    (results_dir / f"{name}.json").write_text(json.dumps(data))


def table_of(title: str, columns: list[str], *rows: list[str]) -> Table:
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def agent_loop_table(llmopt_wall: str = "34.3 s") -> Table:
    columns = ["subject", "wall", "wall vs vLLM", "wall vs llama.cpp"]
    return table_of(
        "agent loop: 4 sessions x 10 turns",
        columns,
        ["llmopt (no flags)", llmopt_wall, "0.59x", "0.34x"],
        ["vLLM-CPU", "58.5 s", "1.00x", "0.57x"],
        ["llama.cpp", "102.0 s", "[red]1.74x[/red]", "1.00x"],
    )


def prefill_table() -> Table:
    return table_of(
        "prefill, one request at a time",
        ["prompt", "subject", "prefill tok/s", "vs llama.cpp", "vs vLLM"],
        ["512", "llmopt (no flags)", "489", "2.67x", "-"],
        ["512", "llama.cpp", "183", "-", "-"],
        ["2,000", "llmopt (no flags)", "355", "2.26x", "-"],
    )


def test_table_data_is_what_the_console_shows() -> None:
    table = Table(title="[bold]BUSY[/bold]\nprefill", caption="cap [i]tion[/i]")
    table.add_column("subject")
    table.add_column("tok/s [dim](best)[/dim]", justify="right")
    table.add_row("[green]llmopt[/green]", Text("489 [33.0-34.1]"))
    table.add_row("llama.cpp")  # a short row: rich fills the rest with empty cells
    assert results.table_data(table) == {
        "title": "BUSY\nprefill",
        "columns": ["subject", "tok/s (best)"],
        "justify": ["left", "right"],
        "rows": [["llmopt", "489 [33.0-34.1]"], ["llama.cpp", ""]],
        "caption": "cap tion",
    }
    assert results.table_data(Table())["title"] is None


def test_write_result_stores_the_printed_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(results, "provenance", lambda: {"command": "python benchmarks/x.py"})
    stored = json.loads(results.write_result("x", {"rounds": [1]}, [agent_loop_table()]).read_text())
    assert stored["tables"][0]["rows"][2] == ["llama.cpp", "102.0 s", "1.74x", "1.00x"]
    assert stored["rounds"] == [1] and stored["provenance"]["command"] == "python benchmarks/x.py"
    assert "tables" not in json.loads(results.write_result("y", {"rounds": [1]}).read_text())


def test_headline_table_reads_the_stored_cells(tmp_path: Path) -> None:
    write_fake(tmp_path, "agent_loop", [agent_loop_table()])
    write_fake(tmp_path, "prefill", [prefill_table()], load_start=0.75)
    machine = "Test CPU (avx2, fma), 2 cores"
    busy = "**(busy machine: not a result)**"
    expected = [
        "| figure | value | ratio to peer | command | machine | link |",
        "|---|---:|---|---|---|---|",
        "| agent loop wall time, llmopt (no flags) | 34.3 s | 0.59x vs vLLM-CPU, 0.34x vs llama.cpp | "
        f"`python benchmarks/agent_loop.py` | {machine} | [agent_loop](docs/figures/agent_loop.md) |",
        f"| prefill tok/s, 512-token prompt, llmopt (no flags) | 489 {busy} | 2.67x vs llama.cpp | "
        f"`python benchmarks/prefill.py` | {machine} | [prefill](docs/figures/prefill.md) |",
        f"| prefill tok/s, 2,000-token prompt, llmopt (no flags) | 355 {busy} | 2.26x vs llama.cpp | "
        f"`python benchmarks/prefill.py` | {machine} | [prefill](docs/figures/prefill.md) |",
    ]
    # No peer_connections or quantized_serving JSON: their headlines are left out, not an error.
    assert figures.render_headline(figures.read_results(tmp_path)).splitlines() == expected


def test_headline_rows_per_server_and_ratios_inside_cells(tmp_path: Path) -> None:
    peers = table_of(
        "200 requests a point",
        ["server", "concurrency", "requests", "failed", "reconnects", "out tok/s"],
        ["llmopt (no flags)", "1", "200", "0", "0", "90"],
        ["llmopt (no flags)", "16", "200", "0", "0", "400"],
        ["llama.cpp", "1", "200", "3", "15", "80"],
        ["llama.cpp", "16", "1,000", "2", "40", "300"],
    )
    quantized = table_of(
        "Quantized decode",
        ["weights", "kernel", "batch-1 tok/s", "batch-16 tok/s", "perplexity"],
        ["fp32", "fp32 packed", "40.0 (1.00x) [39.0-40.0]", "300.0 (1.00x) [290.0-300.0]", "17.1 (+0.0%)"],
        ["gptq", "int4 blocks", "74.0 (1.85x) [70.0-74.0]", "420.0 (1.40x) [400.0-420.0]", "17.9 (+4.7%)"],
    )
    write_fake(tmp_path, "peer_connections", [peers])
    write_fake(tmp_path, "quantized_serving", [quantized])
    rows = [
        line.split(" | ")[:3] for line in figures.render_headline(figures.read_results(tmp_path)).splitlines()
    ]
    assert rows[2:] == [
        ["| requests failed, llmopt bench against llmopt (no flags), keep-alive on", "0 of 400", "-"],
        ["| requests failed, llmopt bench against llama.cpp, keep-alive on", "5 of 1,200", "-"],
        ["| quantized decode batch-1 tok/s, gptq (int4 blocks)", "74.0", "1.85x vs fp32"],
        ["| quantized decode batch-16 tok/s, gptq (int4 blocks)", "420.0", "1.40x vs fp32"],
    ]


def test_a_divergence_is_never_busy_and_stands_beside_its_peer(tmp_path: Path) -> None:
    """KL divergences are no timings: a loaded machine does not make them "not a result"; llmopt's and
    llama.cpp's make one headline row with their quotient."""
    kld = table_of(
        "KL(P_ref || P_model)",
        ["pair (model vs reference)", "mean KLD", "top-1 agree"],
        ["(a) llmopt Q4_1 vs llmopt fp32", "0.004000", "95.00%"],
        ["(b) llama.cpp Q4_1 vs llama.cpp F32", "0.002000", "96.00%"],
        ["(c) llmopt fp32 vs llama.cpp F32", "0.000001", "100.00%"],
    )
    write_fake(tmp_path, "kld_llamacpp", [kld], load_start=1.5, extra={"load_matters": False})
    [result] = figures.read_results(tmp_path)
    assert not result.busy
    lines = figures.render_headline([result]).splitlines()
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [["0.004000 / 0.002000", "2.00x llama.cpp's"]]


def test_headline_that_outgrew_its_table_names_itself(tmp_path: Path) -> None:
    write_fake(
        tmp_path, "agent_loop", [table_of("renamed", ["subject", "wall time"], ["llmopt (no flags)", "1 s"])]
    )
    with pytest.raises(figures.HeadlineError, match="agent loop wall time.*'wall'.*HEADLINES"):
        figures.render_headline(figures.read_results(tmp_path))


def test_only_the_headline_block_of_the_readme_is_rewritten() -> None:
    rewritten = figures.with_headline(MARKED_README, "| new |")
    assert rewritten == MARKED_README.replace("\nold table\n", "\n\n| new |\n\n")
    assert figures.with_headline(rewritten, "| new |") == rewritten
    # Nothing measured yet: the markers on consecutive lines, as a fresh README has them.
    emptied = MARKED_README.replace("\nold table\n", "\n")
    assert figures.with_headline(MARKED_README, "") == emptied
    assert figures.render_headline([]) == ""
    for unmarked in ("# llmopt\r\nno markers\n", f"{figures.HEADLINE_END}\n{figures.HEADLINE_START}\n"):
        assert figures.with_headline(unmarked, "| new |") == unmarked


def test_pages_name_their_machine_and_a_busy_run(tmp_path: Path) -> None:
    write_fake(tmp_path, "prefill", [prefill_table()], load_start=0.5, cpu="Xeon", flags=("avx512f",))
    write_fake(tmp_path, "agent_loop", [agent_loop_table()])
    write_fake(tmp_path, "agent_loop_quick", [agent_loop_table()])  # a smoke run: not a figure
    write_fake(tmp_path, "kernels", [])  # written before tables were stored: no page
    found = figures.read_results(tmp_path)
    assert [result.name for result in found] == ["agent_loop", "prefill"]
    page = figures.render_page(found[1])
    for line in [
        "- command: `python benchmarks/prefill.py`",
        "- CPU: Xeon; vector flags: avx512f; cores: 2",
        "- load average (1 min): 0.50 at start, 1.25 at end",
        "**busy machine: not a result** (1-minute load average 0.50 at start)",
        "## prefill, one request at a time",
        "| prompt | subject | prefill tok/s | vs llama.cpp | vs vLLM |",
        "|---|---:|---:|---:|---:|",
    ]:
        assert line in page.splitlines()
    assert "busy machine" not in figures.render_page(found[0])
    index = figures.render_index(found).splitlines()
    assert index[-2:] == [
        "| agent_loop | Test CPU (avx2, fma), 2 cores | 2026-01-02 03:04 UTC | "
        "[agent_loop.md](agent_loop.md) |",
        "| prefill (busy machine: not a result) | Xeon (avx512f), 2 cores | 2026-01-02 03:04 UTC | "
        "[prefill.md](prefill.md) |",
    ]


def test_the_comparison_catches_stale_pages(tmp_path: Path) -> None:
    results_dir, committed = tmp_path / "results", tmp_path / "committed"
    write_fake(results_dir, "agent_loop", [agent_loop_table()])
    committed.mkdir()
    readme = committed / "README.md"
    readme.write_text(MARKED_README)
    figures.write_figures(results_dir, committed / "figures", readme)
    assert figures.write_figures(results_dir, committed / "figures", readme) == []  # idempotent
    assert "34.3 s" in readme.read_text()

    def differences() -> list[str]:
        scratch = tmp_path / f"scratch-{len(list(tmp_path.glob('scratch-*')))}"
        scratch.mkdir()
        return regenerated_differences(results_dir, committed / "figures", readme, scratch)

    assert differences() == []
    write_fake(results_dir, "agent_loop", [agent_loop_table(llmopt_wall="30.1 s")])  # a rerun
    assert differences() == ["docs/figures/agent_loop.md", "README.md"]
    (results_dir / "agent_loop.json").unlink()  # its result gone, its page is left over
    (committed / "figures" / "agent_loop.md").write_text("by hand")
    assert differences() == ["docs/figures/README.md", "docs/figures/agent_loop.md", "README.md"]
    write_fake(results_dir, "prefill", [prefill_table()])  # a result without its page
    assert "docs/figures/prefill.md" in differences()
