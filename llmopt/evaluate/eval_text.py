"""Calibration and evaluation text: a user's file (plain text or JSONL) or the default corpus, tokenized
once and split in two so that no evaluation token was seen during calibration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmopt.corpus import default_text
from llmopt.files import jsonl_records

JSONL_TEXT_FIELDS = ("text", "content", "prompt")


def read_text(path: Path | None) -> str:
    """The text of `path` (JSONL: each line's "text", "content" or "prompt" field), or the default."""
    if path is None:
        return default_text()
    if not path.is_file():
        raise ValueError(f"text file not found: {path}")
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".jsonl":
        return raw
    texts = []
    for number, record in jsonl_records(path, raw):
        field = next((f for f in JSONL_TEXT_FIELDS if isinstance(record, dict) and f in record), None)
        if field is None:
            raise ValueError(f"{path}:{number}: no {' / '.join(JSONL_TEXT_FIELDS)} field")
        texts.append(str(record[field]))
    return "\n\n".join(texts)


@dataclass
class TextSplit:
    calibration: list[int]  # the first half of the tokens
    evaluation: list[int]  # the second half


def split_tokens(tokenizer, path: Path | None) -> TextSplit:
    ids = tokenizer.encode(read_text(path), add_special_tokens=False)
    half = len(ids) // 2
    return TextSplit(ids[:half], ids[half:])


def calibration_samples(ids: list[int], num_samples: int, seq_len: int) -> list[list[int]]:
    """Up to `num_samples` consecutive chunks of `seq_len` tokens; fewer when the text is short."""
    count = min(num_samples, len(ids) // seq_len)
    if count < 1:
        raise ValueError(f"the calibration text has {len(ids)} tokens: fewer than one sample of {seq_len}")
    return [ids[i * seq_len : (i + 1) * seq_len] for i in range(count)]


@dataclass
class Window:
    token_ids: list[int]
    num_context: int  # leading tokens that only give context: already scored by the previous window


def eval_windows(ids: list[int], seq_len: int, num_windows: int, stride: int | None = None) -> list[Window]:
    """Sliding windows as in transformers' perplexity guide: each window holds up to `seq_len` tokens
    and scores only the ones no earlier window scored."""
    stride = stride or seq_len
    if len(ids) < 2:
        raise ValueError("the evaluation text has fewer than 2 tokens")
    windows: list[Window] = []
    scored_until = 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + seq_len, len(ids))
        windows.append(Window(ids[begin:end], max(0, scored_until - begin)))
        scored_until = end
        if len(windows) == num_windows or end == len(ids):
            break
    return windows
