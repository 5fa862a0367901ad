"""Compiling structured outputs into xgrammar grammars: one TokenizerInfo per engine (the model's
vocabulary size, the engine's stop tokens), compiled grammars kept in an LRU keyed by the request's
StructuredOutput (kind and spec text). A JSON schema with a keyword xgrammar would not enforce is
refused (schema_support.py)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError

import xgrammar as xgr

from llmopt.engine.structured.request import StructuredOutput

CACHE_SIZE = 128  # compiled grammars kept, least recently used dropped first
# Compiling runs on grammar threads (the server's requests) or the caller's (the in-process API), never
# on the engine's: xgrammar releases the GIL while it compiles, so a slow schema delays only its own
# request. At most this many compile at once; the threads are daemons, so a grammar that never finishes
# compiling cannot hold up the process's exit.
COMPILE_THREADS = 2
# A compile still running after this long fails its askers and gives its place back: a native compile
# cannot be stopped, but one that never ends must not keep later grammars waiting. Such a grammar is
# remembered and refused at once from then on, so that asking again starts no second endless compile.
COMPILE_TIMEOUT_S = 10.0
TIMED_OUT_KEPT = 1024
MAX_ERROR_CHARS = 400
# xgrammar prefixes its messages with a time and its C++ source line: "[12:38:52] /project/cpp/x.cc:94: ".
NATIVE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")
# Any JSON object: strict mode would allow only the properties the schema names, here none at all.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarCompiler:
    def __init__(
        self, tokenizer, vocab_size: int, stop_token_ids: list[int], timeout_s: float = COMPILE_TIMEOUT_S
    ):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[StructuredOutput, xgr.CompiledGrammar] = OrderedDict()
        self._pending: dict[StructuredOutput, Future] = {}  # compiling now: a second asker shares it
        self._timed_out: OrderedDict[StructuredOutput, None] = OrderedDict()
        self._places = threading.Condition()  # guards _compiling
        self._compiling = 0  # compiles holding a place: started, neither done nor timed out

    def submit(self, output: StructuredOutput) -> Future:
        """Compile on a grammar thread; the future holds the compiled grammar, or the ValueError."""
        with self._cache_lock:
            if output in self._cache:
                self._cache.move_to_end(output)
                done: Future = Future()
                done.set_result(self._cache[output])
                return done
            if output in self._pending:
                return self._pending[output]
            if output in self._timed_out:
                refused: Future = Future()
                refused.set_exception(self._timeout_error(output))
                return refused
            future = self._pending[output] = Future()
            future.set_running_or_notify_cancel()  # not cancellable: another asker may share it
        threading.Thread(
            target=self._compile_into, args=(output, future), name="llmopt-grammar", daemon=True
        ).start()
        return future

    def _compile_into(self, output: StructuredOutput, future: Future) -> None:
        with self._places:
            while self._compiling >= COMPILE_THREADS:
                self._places.wait()
            self._compiling += 1
        place = [True]  # held until the compile ends or times out, whichever comes first
        timer = threading.Timer(self.timeout_s, self._time_out, args=(output, future, place))
        timer.daemon = True
        timer.start()
        try:
            settle(future, self.compile, output)
        finally:
            timer.cancel()
            self._give_back(place)
            with self._cache_lock:
                if self._pending.get(output) is future:
                    del self._pending[output]

    def _time_out(self, output: StructuredOutput, future: Future, place: list[bool]) -> None:
        """The compile goes on (nothing stops native code), but its place and its askers are freed."""
        self._give_back(place)
        with self._cache_lock:
            self._timed_out[output] = None
            while len(self._timed_out) > TIMED_OUT_KEPT:
                self._timed_out.popitem(last=False)
            if self._pending.get(output) is future:
                del self._pending[output]
        with contextlib.suppress(InvalidStateError):  # it finished just now after all
            future.set_exception(self._timeout_error(output))

    def _give_back(self, place: list[bool]) -> None:
        with self._places:
            if place[0]:
                place[0] = False
                self._compiling -= 1
                self._places.notify()

    def _timeout_error(self, output: StructuredOutput) -> ValueError:
        return ValueError(f"compiling the {output.kind} took over {self.timeout_s:g} s")

    def cached(self, output: StructuredOutput) -> xgr.CompiledGrammar | None:
        with self._cache_lock:
            compiled = self._cache.get(output)
            if compiled is not None:
                self._cache.move_to_end(output)
            return compiled

    def compile(self, output: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar, from the cache or compiled on this thread; a ValueError saying why when
        xgrammar cannot compile it."""
        compiled = self.cached(output)
        if compiled is not None:
            return compiled
        # xgrammar's native parsers are not meant to see a NUL (vLLM refuses it too).
        if "\x00" in output.spec:
            raise ValueError(f"the {output.kind} must not contain a NUL character")
        with self._cache_lock:
            if output in self._timed_out:
                raise self._timeout_error(output)
        try:
            compiled = compile_with(self._xgrammar(), output)
        except Exception as exc:  # xgrammar raises RuntimeError (and subclasses) for what it cannot read
            message = NATIVE_PREFIX.sub("", str(exc).strip()).replace("\n", " ")[:MAX_ERROR_CHARS]
            raise ValueError(f"xgrammar cannot compile this {output.kind}: {message}") from None
        with self._cache_lock:
            self._cache[output] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _xgrammar(self) -> xgr.GrammarCompiler:
        # Built on first use: reading a 49k-token vocabulary takes a while, and most engines never need it.
        with self._compiler_lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids or None
                )
                # Our LRU is the cache: xgrammar's own would grow without bound.
                self._compiler = xgr.GrammarCompiler(info, max_threads=COMPILE_THREADS, cache_enabled=False)
            return self._compiler


def settle(future: Future, fn, *args) -> None:
    """Set `future` to fn(*args) or its exception, unless it was settled already (a time-out)."""
    try:
        result = fn(*args)
    except Exception as exc:  # the asker's to report (a ValueError: the client's grammar)
        with contextlib.suppress(InvalidStateError):
            future.set_exception(exc)
        return
    with contextlib.suppress(InvalidStateError):
        future.set_result(result)


def compile_with(compiler: xgr.GrammarCompiler, output: StructuredOutput) -> xgr.CompiledGrammar:
    """JSON is written on one line with json.dumps' separators (", " and ": "): with no optional
    whitespace the grammar forces every key and punctuation mark, and a small model cannot loop on
    blank lines."""
    if output.kind == "json_object":
        return compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False, strict_mode=False)
    if output.kind == "json_schema":
        return compiler.compile_json_schema(output.spec, any_whitespace=False)
    if output.kind == "regex":
        return compiler.compile_regex(output.spec)
    if output.kind == "choice":
        return compiler.compile_grammar(choice_grammar(json.loads(output.spec)))
    if "::=" not in output.spec:  # no EBNF rule in it: Lark's notation (start rule `start`), as vLLM reads it
        return compiler.compile_lark(output.spec)
    return compiler.compile_grammar(output.spec)


def choice_grammar(choices: list[str]) -> str:
    """EBNF that admits exactly one of `choices`."""
    assert choices and all(isinstance(c, str) and c for c in choices), "choices are non-empty strings"
    return "root ::= " + " | ".join(f'"{ebnf_escape(c)}"' for c in choices)


def ebnf_escape(text: str) -> str:
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "".join(escapes.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x20 else ch) for ch in text)
