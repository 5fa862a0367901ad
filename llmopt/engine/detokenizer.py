from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of output tokens into text deltas.

    A delta never ends inside a multi-byte character (decoding that yields U+FFFD is held back until
    the next token completes it), and with stop strings the last len(longest stop) - 1 characters are
    held back too, so that streamed text never shows a stop string that the final text cuts off.
    """

    # Prompt tokens decoded with the output so that tokenizers that drop a leading space see context.
    CONTEXT_TOKENS = 4

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str]):
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids[-self.CONTEXT_TOKENS :])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.emitted = 0

    def add(self, token_id: int) -> str | None:
        """Append a token; return the stop string it completed, if any."""
        self.token_ids.append(token_id)
        decode = self.tokenizer.decode
        prefix_text = decode(
            self.token_ids[self.prefix_offset : self.read_offset],
            skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
        )
        new_text = decode(
            self.token_ids[self.prefix_offset :], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None
        delta = new_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        found = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) != -1]
        if not found:
            return None
        index, stop = min(found)
        self.text = self.text[:index]
        return stop

    def take_delta(self, finished: bool) -> str:
        """The text not yet handed out (all of it once finished)."""
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
