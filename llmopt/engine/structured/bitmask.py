"""One step's token bitmask: every grammar row of the batch (a sequence's sampled row, or its rows through
its proposals) filled into one bitmask, applied to the logits in one call, before the batch's one greedy
pick. xgrammar's layout: int32 words, bit t % 32 of word t // 32 allows token t."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import xgrammar as xgr

if TYPE_CHECKING:
    from llmopt.engine.structured.sequence_grammar import SequenceGrammar

NEG_INF = torch.tensor(float("-inf"))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set `logits` [rows, vocab] to -inf wherever `bitmask` [rows, words] bans the token. xgrammar's CPU
    kernel writes each banned logit on its own: about 0.7 ms a 49k-token row where a handful of tokens
    are allowed, as in most of a JSON schema's rows (its keys, enums and punctuation); numpy's unpackbits
    and one torch.where over every row take about 0.1 ms a row."""
    assert bitmask.dtype == torch.int32 and bitmask.shape[0] == logits.shape[0], "one bitmask row per row"
    assert logits.is_contiguous() and bitmask.is_contiguous()
    # Viewed as bytes, a little-endian int32 word holds its tokens in order, lowest bit first.
    words = bitmask.numpy().view(np.uint8)
    allowed = np.unpackbits(words, axis=-1, count=logits.shape[-1], bitorder="little")
    torch.where(torch.from_numpy(allowed.view(np.bool_)), logits, NEG_INF, out=logits)


class BatchMask:
    """The bitmask of one step's grammar rows. `fill` each sequence's rows as the step prepares its
    logits (a failed fill leaves nothing behind: the next sequence takes its place), then `apply` once."""

    def __init__(self, num_rows: int, vocab_size: int):
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(max(num_rows, 1), vocab_size)
        self.rows: list[int] = []  # the logits row of each filled bitmask row, in order

    def fill(self, grammar: SequenceGrammar, rows: slice, proposals: list[int]) -> None:
        """Fill the bitmask of the logits rows `rows`: `grammar`'s state, then after each proposal."""
        start = len(self.rows)
        count = rows.stop - rows.start
        assert start + count <= self.bitmask.shape[0], "more grammar rows than the step counted"
        grammar.fill(self.bitmask[start : start + count], proposals)
        self.rows.extend(range(rows.start, rows.stop))

    def apply(self, logits: torch.Tensor) -> None:
        """Mask every filled row of `logits` [batch rows, vocab]."""
        if not self.rows:
            return
        bitmask = self.bitmask[: len(self.rows)]
        if self.rows == list(range(logits.shape[0])):  # every row follows a grammar: mask in place
            apply_token_bitmask(logits, bitmask)
            return
        index = torch.tensor(self.rows)
        rows = logits[index]
        apply_token_bitmask(rows, bitmask)
        logits[index] = rows
