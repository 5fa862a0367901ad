"""Forced tokens as proposals: where a sequence's grammar allows only one continuation (the keys and
punctuation of a JSON schema), the tokens of that text become its proposals, so one forward computes them
all. The verifier checks them as it checks any proposal, under the grammar's mask, so they change
nothing that is sampled; where the grammar allows exactly one token the mask leaves the verifier no other
choice. With an n-gram speculative config, lookups continue past the forced tokens."""

from __future__ import annotations

from llmopt.engine.model_runner import MAX_DECODE_QUERIES
from llmopt.engine.sequence import Sequence
from llmopt.engine.spec_decode.ngram import NgramProposer

# 1 + this many rows keep a sequence among the decode rows, whose attention kernel reads the cache once per
# row; a longer verification would go through the padded prefill path.
MAX_FORCED_TOKENS = MAX_DECODE_QUERIES - 1


def propose_forced(seq: Sequence, max_model_len: int, ngram: NgramProposer | None, k: int) -> bool:
    """Give `seq` the tokens its grammar forces as proposals, then up to `k` n-gram tokens past them that
    the grammar allows; False (and nothing set) where nothing is forced."""
    grammar = seq.grammar
    if grammar is None or not seq.params.forced_tokens or seq.num_computed_tokens != len(seq) - 1:
        return False  # no grammar, forcing turned off, or still prefilling
    room = min(
        MAX_FORCED_TOKENS,
        seq.params.max_tokens - seq.num_output_tokens - 1,  # the verification adds one token itself
        max_model_len - len(seq) - 1,
    )
    forced = grammar.forced_tokens(room)
    if not forced:
        return False
    proposal = list(forced)
    if ngram is not None and (more := min(k, room - len(forced))) > 0:
        proposal += ngram.lookup(seq.token_ids + forced, more)
        del proposal[grammar.valid_prefix(proposal) :]
    seq.spec_token_ids, seq.spec_draft_probs, seq.spec_num_forced = proposal, None, len(forced)
    return True
