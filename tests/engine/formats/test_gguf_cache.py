"""The parsed-GGUF cache: a second read comes from disk and equals the parse, one entry per content
(not per path), a changed file or a torn entry is parsed again, and two processes filling the cache at
once both get the parse and leave one whole entry, no temporary files."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from llmopt.engine.formats import gguf_cache
from llmopt.engine.formats.gguf import read_gguf
from llmopt.engine.formats.gguf_cache import read_gguf_cached
from tests.engine.formats.test_gguf import write_gguf

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 4, 2, 8, 64


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
    k = rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
    write_gguf(
        path,
        {
            "blk.0.attn_q.weight": (quantize(q, T.Q4_1), T.Q4_1),
            "blk.0.attn_k.weight": (quantize(k, T.Q8_0), T.Q8_0),
            "blk.0.attn_norm.weight": (rng.standard_normal(HIDDEN).astype(np.float32), T.F32),
        },
    )
    return path


def assert_same(got, expected) -> None:
    (dense, quantized), (dense_ref, quantized_ref) = got, expected
    assert dense.keys() == dense_ref.keys() and quantized.keys() == quantized_ref.keys()
    assert all(torch.equal(dense[n], dense_ref[n]) for n in dense)
    for name, w in quantized.items():
        ref = quantized_ref[name]
        assert (w.bits, w.group_size) == (ref.bits, ref.group_size)
        assert torch.equal(w.q, ref.q) and torch.equal(w.scale, ref.scale) and torch.equal(w.zero, ref.zero)


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "gguf-native").iterdir()) if (cache / "gguf-native").is_dir() else []


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_read_comes_from_the_cache_and_equals_the_parse(tmp_path, cache, monkeypatch):
    path = tiny_gguf(tmp_path / "a.gguf")
    expected = read_gguf(path, HEADS, KV_HEADS)
    assert_same(read_gguf_cached(path, HEADS, KV_HEADS), expected)
    assert len(entries(cache)) == 1

    def no_parse(*args):
        raise AssertionError("parsed again although the cache holds this file")

    monkeypatch.setattr(gguf_cache.gguf_reader, "read_gguf", no_parse)
    assert_same(read_gguf_cached(path, HEADS, KV_HEADS), expected)
    copy = tmp_path / "elsewhere" / "renamed.gguf"  # the same content under another path and name
    copy.parent.mkdir()
    shutil.copy(path, copy)
    assert_same(read_gguf_cached(copy, HEADS, KV_HEADS), expected)
    assert len(entries(cache)) == 1


def test_a_changed_file_is_parsed_again_into_an_entry_of_its_own(tmp_path, cache):
    path = tiny_gguf(tmp_path / "model.gguf")
    read_gguf_cached(path, HEADS, KV_HEADS)
    before = path.stat().st_mtime_ns
    tiny_gguf(path, seed=1)
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a rewrite within the clock's tick, as time moves
    assert_same(read_gguf_cached(path, HEADS, KV_HEADS), read_gguf(path, HEADS, KV_HEADS))
    assert len(entries(cache)) == 2


def test_a_torn_entry_is_parsed_again_and_rewritten(tmp_path, cache):
    path = tiny_gguf(tmp_path / "model.gguf")
    read_gguf_cached(path, HEADS, KV_HEADS)
    [entry] = entries(cache)
    entry.write_bytes(entry.read_bytes()[:100])
    assert_same(read_gguf_cached(path, HEADS, KV_HEADS), read_gguf(path, HEADS, KV_HEADS))
    assert entry.stat().st_size > 100


def fill(path: str, cache: str, barrier, results) -> None:
    os.environ["LLMOPT_CACHE"] = cache
    barrier.wait()
    dense, quantized = read_gguf_cached(Path(path), HEADS, KV_HEADS)
    results.put(
        {n: w.q.sum().item() for n, w in quantized.items()} | {n: t.sum().item() for n, t in dense.items()}
    )


def test_two_processes_filling_the_cache_at_once_both_get_the_parse_and_leave_one_whole_entry(tmp_path):
    path = tiny_gguf(tmp_path / "model.gguf")
    dense, quantized = read_gguf(path, HEADS, KV_HEADS)
    expected = {n: w.q.sum().item() for n, w in quantized.items()} | {
        n: t.sum().item() for n, t in dense.items()
    }
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    cache = tmp_path / "cache"
    procs = [ctx.Process(target=fill, args=(str(path), str(cache), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got == [expected, expected]
    [entry] = entries(cache)  # no temporary file left beside it
    assert_same(gguf_cache.load_entry(entry), (dense, quantized))
