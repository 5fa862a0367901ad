"""One sequence's place in its grammar. Between steps its matcher has accepted exactly the sequence's
output tokens: proposals are accepted only while their rows' masks are filled, then rolled back."""

from __future__ import annotations

import torch
import xgrammar as xgr


class SequenceGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int):
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.stop_token_ids = set(self.matcher.stop_token_ids)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, proposals: list[int]) -> None:
        """Fill `bitmask` [1 + len(proposals), words]: row i allows what the grammar allows after the first
        i proposals; the matcher is back where it was after."""
        assert bitmask.shape[0] == len(proposals) + 1, "one bitmask row per proposal, and one after them"
        advanced = 0
        for i, token in enumerate(proposals):
            self.matcher.fill_next_token_bitmask(bitmask, i)
            if token in self.stop_token_ids or not self.matcher.accept_token(token):
                # Its own row rejects this proposal, so the rows after it are never read.
                bitmask[i + 1 :] = bitmask[i]
                break
            advanced += 1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, len(proposals))
        if advanced:
            self.matcher.rollback(advanced)

    def accept(self, tokens: list[int]) -> None:
        """Advance through the tokens the sequence gained (each picked from masked logits)."""
        for token in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(token):
                # Only a row with every allowed token banned gets here (its max is a -inf); the request
                # fails alone, as one with nothing left to sample does.
                raise ValueError(f"token {token} does not follow the requested structured output")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar allows from here (a stop token ends the count: it ends
        the output, so it is never worth proposing)."""
        accepted = 0
        for token in tokens:
            if token in self.stop_token_ids or not self.matcher.accept_token(token):
                break
            accepted += 1
        if accepted:
            self.matcher.rollback(accepted)
        return accepted

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to `limit` tokens of the only text the grammar allows next (xgrammar's jump-forward
        tokens: the vocabulary's longest tokens over that text, the last one left out where a longer
        token could extend it)."""
        if limit <= 0 or self.matcher.is_terminated():
            return []
        return self.matcher.find_jump_forward_tokens()[:limit]
