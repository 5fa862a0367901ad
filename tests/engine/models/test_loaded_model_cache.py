"""The bundled GGUF as the engine loaded it, saved and mapped back in: the same logits, no second load,
every start holding the mapped file (in 2 MB pages where the system has them), and a new file when
anything it depends on changes."""

from __future__ import annotations

import pytest
import torch

from llmopt.checkpoints import bundled_gguf_path
from llmopt.engine.layers import gguf_panels
from llmopt.engine.models import huge_pages, loaded_model_cache
from llmopt.engine.models.loaded_model_cache import cache_key, load_model_cached


def logits_of(model, token_ids: list[int]) -> torch.Tensor:
    hidden = model.embed(torch.tensor(token_ids))
    return model.logits(hidden)  # the output layer alone: the part --dtype auto makes int8


def mapping_of(path) -> dict[str, int]:
    """This process's mapping of `path`, from /proc/self/smaps: its address range and sizes in bytes."""
    mapping: dict[str, int] = {}
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                if mapping:
                    break
                if fields[-1] == str(path):
                    mapping["start"], mapping["end"] = (int(a, 16) for a in fields[0].split("-"))
            elif mapping and fields[0] in ("Rss:", "FilePmdMapped:"):
                mapping[fields[0][:-1]] = int(fields[1]) * 1024
    return mapping


@pytest.mark.model
def test_the_first_start_maps_the_saved_model_too(tmp_path, monkeypatch):
    """The start that builds the model returns the saved file mapped, as later starts do, not its built
    copy; and where huge pages work, the weights it reads sit in 2 MB pages."""
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))
    model = load_model_cached(bundled_gguf_path(), torch.float32, True, "auto")
    [saved_file] = list((tmp_path / "loaded").glob("*/*.pt"))
    logits_of(model, [1, 42, 4000, 17])
    mapping = mapping_of(saved_file)
    assert mapping, "the saved file is not mapped"
    tensors = [t for t in model.state_dict().values() if t.numel()]
    assert all(mapping["start"] <= t.data_ptr() < mapping["end"] for t in tensors)
    share = huge_pages.cache_in_huge_pages(saved_file)
    if share is not None and share >= huge_pages.ENOUGH:
        assert mapping["FilePmdMapped"] >= 0.9 * mapping["Rss"]


@pytest.mark.model
def test_a_second_load_maps_the_saved_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))
    gguf = bundled_gguf_path()
    built = load_model_cached(gguf, torch.float32, True, "auto")
    [saved_file] = list((tmp_path / "loaded").glob("*/*.pt"))
    assert saved_file.stat().st_size < 1.5 * gguf.stat().st_size  # about the model's own size

    def no_second_load(*args):
        raise AssertionError("the saved model should have been read")

    monkeypatch.setattr(loaded_model_cache, "load_model", no_second_load)
    saved = load_model_cached(gguf, torch.float32, True, "auto")
    assert saved is not built and type(saved) is type(built)
    assert saved.lm_head_t.kernel == built.lm_head_t.kernel == ("gguf" if gguf_panels.supported() else "w8a8")
    for a, b in zip(built.state_dict().values(), saved.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    layers = [(m, n) for m, n in zip(built.modules(), saved.modules(), strict=True) if hasattr(m, "kernel")]
    assert len(layers) == 121  # 30 layers x 4 fused linears, and the output layer
    for a, b in layers:
        assert all(torch.equal(x, y) for x, y in zip(a.kernel_weights(), b.kernel_weights(), strict=True))
    token_ids = [1, 42, 4000, 17]
    assert torch.equal(logits_of(saved, token_ids), logits_of(built, token_ids))


def test_the_key_changes_with_what_the_model_depends_on(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    key = cache_key(gguf, torch.float32, "auto")
    assert cache_key(gguf, torch.float32, "auto") == key
    assert cache_key(gguf, torch.float32, "float32") != key
    assert cache_key(gguf, torch.bfloat16, "auto") != key
    monkeypatch.setenv("LLMOPT_QUANT_KERNEL", "aten")
    assert cache_key(gguf, torch.float32, "auto") != key
    monkeypatch.delenv("LLMOPT_QUANT_KERNEL")
    monkeypatch.setattr(loaded_model_cache, "sources_digest", lambda: "another llmopt")
    assert cache_key(gguf, torch.float32, "auto") != key
    monkeypatch.undo()
    gguf.write_bytes(b"GGUF, another file")
    assert cache_key(gguf, torch.float32, "auto") != key


def test_the_sources_digest_reads_the_kernels_too(tmp_path, monkeypatch):
    """A panel layout the C++ kernel alone changes (gguf_matmul.cpp reads what gguf_panels.py packs)
    must not map in a file saved for the old one."""
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "panels.py").write_text("COLUMNS = 16\n")
    (tmp_path / "kernels").mkdir()
    kernel = tmp_path / "kernels" / "matmul.cpp"
    kernel.write_text("// Q8_0 as signed bytes\n")
    monkeypatch.setattr(loaded_model_cache, "ENGINE_SOURCES", tmp_path)
    before = loaded_model_cache.sources_digest()
    kernel.write_text("// Q8_0 as signed bytes plus 128\n")
    assert loaded_model_cache.sources_digest() != before
    (tmp_path / "kernels" / "vector_math.h").write_text("// a header\n")
    assert loaded_model_cache.sources_digest() != before


@pytest.mark.model
def test_a_drafts_q4_0_copy_is_saved_beside_the_files_own(tmp_path, monkeypatch):
    """The same file served as a model and as a draft keeps both saved copies: neither start rebuilds
    what the other saved (a model's folder keeps one file)."""
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))
    gguf = bundled_gguf_path()
    as_model = load_model_cached(gguf, torch.float32, True, "auto")
    as_draft = load_model_cached(gguf, torch.float32, True, "auto", q4_0=True)
    assert len(list((tmp_path / "loaded").glob("*/*.pt"))) == 2
    assert not torch.equal(logits_of(as_model, [1, 42]), logits_of(as_draft, [1, 42]))  # its Q4_0 head

    def no_second_load(*args):
        raise AssertionError("the saved model should have been read")

    monkeypatch.setattr(loaded_model_cache, "load_model", no_second_load)
    load_model_cached(gguf, torch.float32, True, "auto")
    load_model_cached(gguf, torch.float32, True, "auto", q4_0=True)
