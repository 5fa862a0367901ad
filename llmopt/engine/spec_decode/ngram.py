"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the context's last n
tokens. Costs nothing, wins wherever text repeats."""

from __future__ import annotations

import numpy as np

from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.proposal import Proposal


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        return [Proposal(self.lookup(seq.token_ids, k)) for seq, k in zip(seqs, ks)]

    def release(self, request_id: str) -> None:
        """Nothing to free: n-gram lookups keep no per-request state."""

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest suffix n-gram."""
        context = np.asarray(token_ids)
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)
            matches = np.flatnonzero((windows == context[-n:]).all(axis=1))
            if len(matches):
                start = int(matches[-1]) + n
                return context[start : start + k].tolist()
        return []
