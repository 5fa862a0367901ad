"""Speculative decoding: propose k tokens cheaply, verify them in one forward of the target model.

Proposers: `ngram` (prompt lookup: the tokens that followed the latest earlier occurrence of the
context's last n tokens) and `draft` (a smaller or cheaper model with its own paged KV cache, proposing
autoregressively). Verification keeps the target's distribution exactly: greedy accepts while the
proposal equals the target's argmax; sampling accepts token x with probability min(1, p(x)/q(x)), on the
first rejection samples from norm(max(p - q, 0)), and adds a bonus token when all k are accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmopt.engine.spec_decode.config import SpeculativeConfig
from llmopt.engine.spec_decode.draft import DraftProposer
from llmopt.engine.spec_decode.ngram import NgramProposer

if TYPE_CHECKING:
    from llmopt.engine.config import EngineConfig


def make_proposer(
    config: SpeculativeConfig, engine_config: EngineConfig, vocab_size: int, max_model_len: int
):
    if config.method == "ngram":
        return NgramProposer(config)
    return DraftProposer(config, engine_config, vocab_size, max_model_len)
