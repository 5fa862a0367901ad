"""When a request ends: an EOS or stop token, a stop string, its max_tokens, or the model's context."""

from __future__ import annotations

from llmopt.engine.detokenizer import IncrementalDetokenizer
from llmopt.engine.sequence import Sequence


def stop_reason(
    seq: Sequence,
    token: int,
    length: int,
    detokenizer: IncrementalDetokenizer,
    eos_token_ids: set[int],
    max_model_len: int,
) -> str | None:
    """'stop' or 'length' if `token`, the `length`-th token of `seq`, ends it; None to go on. The
    detokenizer sees every token that is not a stop token (it finds the stop strings)."""
    params = seq.params
    # A grammar allows a stop token only where it is complete, and nothing after it: even with
    # ignore_eos it ends the request.
    ends = not params.ignore_eos or seq.grammar is not None
    if token in eos_token_ids and ends or token in params.stop_token_ids:
        return "stop"
    if detokenizer.add(token) is not None:
        return "stop"
    if length - seq.num_prompt_tokens >= params.max_tokens or length >= max_model_len:
        return "length"
    return None
