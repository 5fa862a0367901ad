"""The grammar compiler's threads: a compile that never ends fails its askers after the timeout and
gives its place back (two of them no longer block every later grammar), is refused at once when asked
again, and identical compiles in flight are shared. xgrammar's compile is replaced by one that hangs on
request, so the test is model-free and takes a second."""

from __future__ import annotations

import threading
import time

import pytest

from llmopt.engine.structured import compiler as compiler_module
from llmopt.engine.structured.compiler import COMPILE_THREADS, GrammarCompiler
from llmopt.engine.structured.request import StructuredOutput

TIMEOUT_S = 0.3


@pytest.fixture
def grammars(monkeypatch):
    """A GrammarCompiler whose compiles of a regex starting with "hang" block until released."""
    release = threading.Event()
    calls: list[str] = []

    def fake_compile(_xgrammar, output: StructuredOutput):
        calls.append(output.spec)
        if output.spec.startswith("hang"):
            release.wait(30)
        elif output.spec.startswith("slow"):
            time.sleep(TIMEOUT_S / 2)
        return f"compiled {output.spec}"

    monkeypatch.setattr(compiler_module, "compile_with", fake_compile)
    monkeypatch.setattr(GrammarCompiler, "_xgrammar", lambda self: None)
    compiler = GrammarCompiler(tokenizer=None, vocab_size=8, stop_token_ids=[0], timeout_s=TIMEOUT_S)
    yield compiler, calls
    release.set()  # the hung threads end with the test


def test_compiles_that_never_end_time_out_and_free_their_places(grammars):
    compiler, calls = grammars
    hung = [compiler.submit(StructuredOutput("regex", f"hang{i}")) for i in range(COMPILE_THREADS)]
    for future in hung:
        with pytest.raises(ValueError, match="took over 0.3 s"):
            future.result(timeout=5)
    # Both places are free again although both compiles still run: a later grammar compiles at once.
    start = time.monotonic()
    assert compiler.submit(StructuredOutput("regex", "a+")).result(timeout=2) == "compiled a+"
    assert time.monotonic() - start < TIMEOUT_S
    # Asking again for a grammar that timed out is refused at once, without a second endless compile.
    with pytest.raises(ValueError, match="took over"):
        compiler.submit(StructuredOutput("regex", "hang0")).result(timeout=0.1)
    with pytest.raises(ValueError, match="took over"):
        compiler.compile(StructuredOutput("regex", "hang1"))  # the in-process path too
    assert sorted(calls) == ["a+", "hang0", "hang1"]


def test_identical_compiles_in_flight_are_shared_and_cached(grammars):
    compiler, calls = grammars
    output = StructuredOutput("regex", "slow")
    first, second = compiler.submit(output), compiler.submit(output)
    assert first is second and first.result(timeout=5) == "compiled slow"
    assert compiler.submit(output).result(timeout=0) == "compiled slow" and calls == ["slow"]
