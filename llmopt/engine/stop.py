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
    if token in eos_token_ids and not params.ignore_eos or token in params.stop_token_ids:
        return "stop"
    if detokenizer.add(token) is not None:
        return "stop"
    if length - seq.num_prompt_tokens >= params.max_tokens or length >= max_model_len:
        return "length"
    return None
