"""The layout is the architecture: imports run one way, down the layers (and inside the bench, down its
wings), and no function needs a scroll bar. The checks read the source (ast), so lazy imports inside
functions count too, and so do imports under `if TYPE_CHECKING:` where circles are looked for: a circle
closed only by a type hint still ties the modules into one."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llmopt"

# What each part of llmopt may import (besides itself). cli -> server / bench / quant / report /
# evaluate -> engine -> checkpoints (-> gguf_model -> gemma3_gguf -> gguf_file, gguf_names; load_cache);
# pricing, cost, corpus and files are
# leaves anyone may read. The bench speaks HTTP and never imports the engine; the report reads run
# folders through the bench's rundir.py (ONLY_THROUGH). engine_servers builds and runs the engines' servers
# (vLLM, llama.cpp): the CLI and the bench start them through it.
LEAVES = {"pricing", "cost", "corpus", "files"}
ALLOWED: dict[str, set[str]] = {
    "cli": {"server", "bench", "quant", "report", "evaluate", "engine", "engine_servers", "checkpoints"}
    | LEAVES,
    "server": {"engine", "checkpoints"},
    "bench": {"engine_servers", "checkpoints"} | LEAVES,
    "quant": {"evaluate", "engine", "checkpoints"} | LEAVES,
    "report": {"bench"} | LEAVES,
    "evaluate": {"engine", "checkpoints"} | LEAVES,
    "engine": {"checkpoints", "gguf_file", "gguf_model", "gguf_names", "load_cache"},
    # never llmopt's engine or server (a peer is another process), only the engine config's defaults
    "engine_servers": {"checkpoints", "engine"},
    "checkpoints": {"gemma3_gguf", "gguf_file", "gguf_model", "load_cache"},
    "gguf_model": {"gemma3_gguf", "gguf_file"},  # a GGUF's config, tokenizer and stop tokens, from its header
    "gemma3_gguf": {"gguf_file", "gguf_names"},  # Gemma 3's config and tokenizer, and its fp32 folder
    "gguf_file": set(),  # the GGUF format: header and tensor bytes
    "gguf_names": set(),  # llama.cpp's tensor names, which the engine's reader and the converter share
    "load_cache": set(),  # what a start builds from a model's files, kept on disk (tokenizer, loaded model)
    "pricing": {"files"},
    # prices workloads: a run's records and points as the bench's schema types them, never the run
    # folder itself, a server or the engine
    "cost": {"pricing", "bench"},
    "corpus": set(),
    "files": set(),
    "__init__": {"engine"},  # `from llmopt import LLM, SamplingParams`
}
# Where a part may import only some modules of another: {part: {other part: the modules it may import}}.
# The report reads run folders through bench/rundir.py alone, whose file list is the contract between
# them, and their records as bench/schema.py types them: nothing else of the bench's insides. The cost
# package reads those types alone.
# engine_servers reads the defaults of the serve options llmopt's engine takes from its EngineConfig, and
# reads --speculative-config with the engine's own parser (one set of rules and messages for every engine).
ONLY_THROUGH: dict[str, dict[str, set[str]]] = {
    "report": {"bench": {"llmopt.bench.rundir", "llmopt.bench.schema"}},
    "cost": {"bench": {"llmopt.bench.schema"}},
    "engine_servers": {"engine": {"llmopt.engine.config", "llmopt.engine.spec_decode.config"}},
}
# The bench's wings (issue #54): what each may import of the others. The data runs recipe -> sweep ->
# load -> measure -> run folder -> report: the sweep reads the recipe and drives every other wing;
# servers start what the load is sent to (its Target); the load sends a workload's requests and reads
# the observers' meters beside them; the measures read what the load recorded (and what the observers
# read) into figures. The top modules (the run folder's contract and the few settings every wing reads)
# import no wing. An arrow not listed here runs back up, and the test below names it.
BENCH_TOP = "top"
WING_ALLOWED: dict[str, set[str]] = {
    "sweep": {"servers", "load", "measure", "observe", "workload"},
    "servers": {"load"},
    "load": {"observe", "workload"},
    "measure": {"load", "observe"},
    "observe": set(),
    "workload": set(),
    BENCH_TOP: set(),
}
# Circles closed by a type-only import that are not the bench's (issue #54 left the server alone): the
# Messages and Responses handlers take the routes object as a type hint, the routes import the handlers.
TYPE_ONLY_CIRCLES_LEFT = [
    [
        "llmopt.server.messages_api",
        "llmopt.server.messages_events",
        "llmopt.server.responses_api",
        "llmopt.server.responses_events",
        "llmopt.server.routes",
    ]
]
MAX_FUNCTION_LINES = 60


def part_of(module: str) -> str | None:
    """'llmopt.engine.llm_engine' -> 'engine'; None for anything outside llmopt."""
    names = module.split(".")
    if names[0] != "llmopt":
        return None
    return names[1] if len(names) > 1 else "__init__"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    names = list(relative.parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def imported_modules(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((node.lineno, base))
    return found


def type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of imports under `if TYPE_CHECKING:`: names for type hints, never run."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return lines


def import_graph(root: Path = PACKAGE, type_only: bool = True) -> dict[str, set[str]]:
    """module -> the llmopt modules it imports (lazy ones too; `from pkg import mod` is an arrow to
    pkg.mod, not to pkg); imports under `if TYPE_CHECKING:` are arrows unless `type_only` is False."""
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = set() if type_only else type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skipped:
                continue
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                submodules = {f"{base}.{a.name}" for a in node.names} & modules.keys()
                graph[name] |= submodules or ({base} & modules.keys())
        graph[name].discard(name)
    return graph


def import_circles(root: Path = PACKAGE, type_only: bool = True) -> list[list[str]]:
    """Every set of modules that import each other round a circle (Tarjan's strongly connected parts);
    with `type_only`, imports under `if TYPE_CHECKING:` close circles too."""
    graph, index, low, stack, on_stack, circles = import_graph(root, type_only), {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while (top := stack.pop()) != node:
                on_stack.discard(top)
                part.append(top)
            on_stack.discard(node)
            if part:
                circles.append(sorted([node, *part]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def back_imports(root: Path = PACKAGE) -> list[str]:
    wrong = []
    for path in sorted(root.rglob("*.py")):
        here = part_of(module_name(path, root))
        for line, module in imported_modules(path, root):
            there = part_of(module)
            if there is None or there == here:
                continue
            through = ONLY_THROUGH.get(here, {}).get(there)
            if there not in ALLOWED.get(here, set()) or (through is not None and module not in through):
                wrong.append(f"{path.relative_to(root.parent)}:{line}: {here} imports {module}")
    return wrong


def wing_of(module: str) -> str | None:
    """'llmopt.bench.load.client' -> 'load'; 'llmopt.bench.rundir' -> BENCH_TOP; None outside the bench
    and for the bench's own face (llmopt/bench/__init__.py), which may name any wing."""
    names = module.split(".")
    if names[:2] != ["llmopt", "bench"] or len(names) < 3:
        return None
    return names[2] if names[2] in WING_ALLOWED else BENCH_TOP


def wrong_wing_arrows(root: Path = PACKAGE) -> list[str]:
    """Every import of one bench wing by another that WING_ALLOWED does not list, type-only ones too."""
    graph, wrong = import_graph(root), []
    for module in sorted(graph):
        here = wing_of(module)
        for there in sorted(graph[module]):
            wing = wing_of(there)
            if here is None or wing is None or wing == here:
                continue
            if wing != BENCH_TOP and wing not in WING_ALLOWED[here]:
                wrong.append(f"{module} ({here}) imports {there} ({wing})")
    return wrong


def long_functions(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(
                        f"{path.relative_to(root.parent)}:{node.lineno}: {node.name} ({lines} lines)"
                    )
    return found


def test_every_part_of_llmopt_has_a_layer():
    parts = {part_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(ALLOWED), f"parts without a layer: {parts - set(ALLOWED)}"


def test_imports_run_down_the_layers():
    assert back_imports() == []


def test_a_back_import_is_caught(tmp_path):
    fake = tmp_path / "llmopt"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "runner.py").write_text("def f():\n    from llmopt.server.app import create_app\n")
    (fake / "bench").mkdir()
    (fake / "bench" / "sweep.py").write_text("from ..engine import llm_engine\n")
    assert back_imports(fake) == [
        "llmopt/bench/sweep.py:1: bench imports llmopt.engine",
        "llmopt/engine/runner.py:2: engine imports llmopt.server.app",
    ]


def test_the_report_reaching_past_the_run_folder_is_caught(tmp_path):
    fake = tmp_path / "llmopt"
    (fake / "report").mkdir(parents=True)
    (fake / "report" / "data.py").write_text("from llmopt.bench.rundir import RunDir\n")
    (fake / "report" / "costs.py").write_text("def f():\n    from llmopt.bench.token_cost import per\n")
    assert back_imports(fake) == ["llmopt/report/costs.py:2: report imports llmopt.bench.token_cost"]


def test_no_modules_import_each_other_round_a_circle():
    assert import_circles() == TYPE_ONLY_CIRCLES_LEFT


def test_no_bench_module_sits_in_a_circle_even_through_a_type_hint():
    assert [c for c in import_circles() if any(m.startswith("llmopt.bench") for m in c)] == []


def test_the_bench_wings_import_only_down_their_arrows():
    assert wrong_wing_arrows() == []


def test_a_wrong_wing_arrow_is_caught(tmp_path):
    fake = tmp_path / "llmopt"
    for wing in ("sweep", "load", "measure"):
        (fake / "bench" / wing).mkdir(parents=True)
        (fake / "bench" / wing / "__init__.py").write_text("")
    (fake / "bench" / "__init__.py").write_text("from llmopt.bench.sweep import sweep\n")  # the face: free
    (fake / "bench" / "rundir.py").write_text("")
    (fake / "bench" / "sweep" / "sweep.py").write_text("from llmopt.bench.load import client\n")
    (fake / "bench" / "load" / "client.py").write_text("from llmopt.bench.rundir import RunDir\n")
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmopt.bench.sweep import sweep\n"
    (fake / "bench" / "load" / "runner.py").write_text(typed)
    (fake / "bench" / "measure" / "metrics.py").write_text("from llmopt.bench.load import client\n")
    lazy = "def f():\n    from llmopt.bench.sweep import sweep\n"
    (fake / "bench" / "measure" / "late.py").write_text(lazy)
    assert wrong_wing_arrows(fake) == [
        "llmopt.bench.load.runner (load) imports llmopt.bench.sweep.sweep (sweep)",
        "llmopt.bench.measure.late (measure) imports llmopt.bench.sweep.sweep (sweep)",
    ]


def test_an_import_circle_is_caught_a_type_hint_too_where_asked(tmp_path):
    fake = tmp_path / "llmopt"
    (fake / "bench").mkdir(parents=True)
    (fake / "bench" / "__init__.py").write_text("")
    (fake / "bench" / "runner.py").write_text("def f():\n    from llmopt.bench.workers import run\n")
    (fake / "bench" / "workers.py").write_text("from llmopt.bench import runner\n")
    (fake / "bench" / "config.py").write_text("from llmopt.bench.workload import WORKLOADS\n")
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmopt.bench.config import C\n"
    (fake / "bench" / "workload.py").write_text(typed)
    assert import_circles(fake, type_only=False) == [["llmopt.bench.runner", "llmopt.bench.workers"]]
    typed_circle = ["llmopt.bench.config", "llmopt.bench.workload"]
    assert import_circles(fake) == [typed_circle, ["llmopt.bench.runner", "llmopt.bench.workers"]]


def test_no_function_needs_a_scroll_bar():
    assert long_functions() == []
