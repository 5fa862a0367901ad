from __future__ import annotations

import json

import pytest

from llmopt.evaluate.eval_text import calibration_samples, eval_windows, read_text, split_tokens


def test_default_text_is_split_into_disjoint_halves(llm):
    split = split_tokens(llm.tokenizer, None)
    assert len(split.calibration) > 10_000 and abs(len(split.calibration) - len(split.evaluation)) <= 1
    samples = calibration_samples(split.calibration, 4, 128)
    assert [len(s) for s in samples] == [128] * 4


def test_user_files_plain_and_jsonl(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("hello world")
    assert read_text(plain) == "hello world"
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"text": "first"}) + "\n\n" + json.dumps({"prompt": "second"}) + "\n")
    assert read_text(jsonl) == "first\n\nsecond"
    jsonl.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="data.jsonl:2: not JSON"):
        read_text(jsonl)
    with pytest.raises(ValueError, match="not found"):
        read_text(tmp_path / "missing.txt")


def test_too_little_text_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one sample"):
        calibration_samples(list(range(100)), 4, 256)


def test_sliding_windows_score_every_token_once():
    ids = list(range(1000))
    windows = eval_windows(ids, seq_len=256, num_windows=100, stride=128)
    assert windows[0].num_context == 0 and windows[1].num_context == 128
    scored = sum(len(w.token_ids) - max(1, w.num_context) for w in windows)
    assert scored == len(ids) - 1  # every token but the first, exactly once
    assert len(eval_windows(ids, seq_len=256, num_windows=2)) == 2
