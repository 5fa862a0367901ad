"""What a proposer hands the verifier for one sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    tokens: list[int]
    draft_probs: torch.Tensor | None = None  # [k, vocab] for a draft model's sampled proposals; None: one-hot
