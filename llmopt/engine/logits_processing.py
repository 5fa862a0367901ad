"""A step's logits before any token is picked: which rows each sequence gets (prompt rows it scores, rows
it samples from), the changes made to the sampled rows in place (penalties, the grammar's mask, the
min_tokens ban) and the prompt logprobs scored from the prompt rows."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from llmopt.engine.penalties import apply_penalties
from llmopt.engine.sampler import ban_stop_tokens
from llmopt.engine.sequence import Sequence
from llmopt.engine.structured.bitmask import BatchMask
from llmopt.engine.token_logprobs import first_prompt_token, token_logprobs


@dataclass(frozen=True)
class SeqRows:
    """Where one sequence's rows lie in the step's logits."""

    start: int  # its first row
    scored: int  # rows scoring its prompt (prompt logprobs); 0 for most
    sampled: int  # rows its next tokens come from; 0 for a prefill chunk with more to come

    @property
    def prompt(self) -> slice:
        return slice(self.start, self.start + self.scored)

    @property
    def sample(self) -> slice:
        return slice(self.start + self.scored, self.start + self.scored + self.sampled)


@dataclass
class PreparedLogits:
    """What preparing a step's logits left beside them, by id(seq)."""

    raws: dict[int, torch.Tensor] = field(default_factory=dict)  # untouched rows, for logprobs
    errors: dict[int, Exception] = field(default_factory=dict)  # why a sequence's rows could not be prepared


def logit_rows(seq: Sequence, n: int) -> tuple[int, int]:
    """(rows scored, rows sampled) of `seq`'s `n` new tokens this step. A sequence whose new tokens reach
    the end of its context samples from one row, or from 1 + k when it verifies k proposed tokens; one
    whose prompt is being scored for prompt logprobs also gets every row before those (row i predicts
    the prompt token after it)."""
    reaches_end = seq.num_computed_tokens + n == len(seq) + len(seq.spec_token_ids)
    sampled = 1 + len(seq.spec_token_ids) if reaches_end else 0
    return (n - sampled if seq.needs_prompt_logits else 0), sampled


def batch_rows(seqs: list[Sequence], num_new_tokens: list[int]) -> tuple[list[int], list[SeqRows]]:
    """The logits rows to ask the runner for, per sequence, and where each sequence's lie in its answer
    (one sequence's rows follow the last one's)."""
    rows = [logit_rows(s, n) for s, n in zip(seqs, num_new_tokens)]
    counts = [scored + sampled for scored, sampled in rows]
    starts = itertools.accumulate(counts, initial=0)
    return counts, [SeqRows(start, scored, sampled) for start, (scored, sampled) in zip(starts, rows)]


def prepare_logits(
    seqs: list[Sequence],
    logits: torch.Tensor,
    samples: list[slice],
    eos_token_ids: set[int],
    vocab_size: int,
) -> PreparedLogits:
    """Change every sequence's sampled rows of `logits` in place before any token is picked, so one
    batched pick sees them final: penalties, the grammar's mask (every grammar row of the step filled
    into one bitmask and applied in one call), the min_tokens ban. Keeps the untouched rows of those that
    asked for logprobs, and the error of any whose rows could not be prepared."""
    prepared = PreparedLogits()
    grammar_rows = sum(s.stop - s.start for seq, s in zip(seqs, samples) if seq.grammar is not None)
    # Most steps have no grammar row: they allocate no bitmask.
    masks = BatchMask(grammar_rows, vocab_size) if grammar_rows else None
    for seq, sample in zip(seqs, samples):
        if sample.start == sample.stop or seq.params.max_tokens == 0:
            continue
        rows = logits[sample]
        try:
            # Logprobs are of the model's own distribution (vLLM's raw_logprobs): kept before anything
            # changes the rows.
            if seq.params.logprobs is not None:
                prepared.raws[id(seq)] = rows.clone()
            apply_penalties(rows, seq)
            if seq.grammar is not None:  # row by row through the proposals (masks: counted above)
                masks.fill(seq.grammar, sample, seq.spec_token_ids)
            ban_stop_tokens(rows, eos_token_ids, seq.params, seq.num_output_tokens)
        except Exception as exc:
            prepared.errors[id(seq)] = exc
    if masks is not None:
        masks.apply(logits)
    return prepared


def score_prompt(seq: Sequence, logits: torch.Tensor) -> None:
    """Record the logprobs of the prompt tokens this chunk's rows predict (row i: the token at position
    start + i + 1); a recompute after a preemption writes them again."""
    start = seq.num_computed_tokens
    if start == 0:
        seq.prompt_logprobs = [first_prompt_token(seq.token_ids[0])]
    assert seq.prompt_logprobs is not None and len(seq.prompt_logprobs) >= start + 1
    del seq.prompt_logprobs[start + 1 :]
    targets = seq.token_ids[start + 1 : start + 1 + len(logits)]
    seq.prompt_logprobs += token_logprobs(logits, targets, seq.params.prompt_logprobs)
