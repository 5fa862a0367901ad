"""Token-exact text: the default corpus tokenized, cuts of it that encode to an exact length, and token
counts with the same tokenizer (the bundled model's by default)."""

from __future__ import annotations

from llmopt.corpus import default_text


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def corpus_token_ids(tokenizer) -> list[int]:
    """The default corpus (llmopt/corpus.py), tokenized."""
    return tokenizer.encode(default_text(), add_special_tokens=False)


def text_of_length(tokenizer, ids: list[int], length: int) -> str:
    """Text that the tokenizer encodes to exactly `length` tokens, cut from `ids`."""
    if length <= 0:
        return ""

    def decode(n: int) -> str:
        return tokenizer.decode(ids[:n], skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # Decoding and re-encoding can merge or split tokens at the cut: try cuts around `length` first.
    candidates = [decode(n) for n in range(max(1, length - 4), min(len(ids), length + 4) + 1)]
    for text in candidates:
        if count_tokens(tokenizer, text) == length:
            return text
    text = candidates[-1]
    for _ in range(64):  # then trim characters, or pad with single-token words, until it fits
        n = count_tokens(tokenizer, text)
        if n == length:
            return text
        text = text[:-1] if n > length else text + " a"
    raise ValueError(f"could not build a prompt of exactly {length} tokens")
