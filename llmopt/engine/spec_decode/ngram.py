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

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest suffix n-gram: one pass
        over the earlier occurrences of the last token, each extended backwards (a sliding window per n
        took ~60 us a sequence and step, ~0.3 % of a 4-stream step on the 1.5B)."""
        context = np.asarray(token_ids)
        last = len(context) - 1
        longest = min(self.max_n, last)
        ends = np.flatnonzero(context[:-1] == context[-1])  # where an earlier occurrence ends
        matched = np.ones(len(ends), dtype=np.int64)  # its length, up to `longest`
        for back in range(1, longest):
            extends = (matched == back) & (ends >= back)
            extends[extends] = context[ends[extends] - back] == context[last - back]
            matched += extends
        if not len(ends) or (best := int(matched.max())) < self.min_n:
            return []
        start = int(ends[np.flatnonzero(matched == best)[-1]]) + 1
        return context[start : start + k].tolist()
