"""Counters of proposals and acceptances, for /metrics and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    drafts: int = 0  # verification steps that had at least one proposed token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    forced_tokens: int = 0  # accepted proposals that the grammar forced (spec_decode/forced.py)
    proposed_at: list[int] = field(default_factory=list)  # per position: how often a token was proposed
    accepted_at: list[int] = field(default_factory=list)  # ... and accepted

    def record(self, proposed: int, accepted: int, forced: int = 0) -> None:
        """One verification: `proposed` tokens, the first `accepted` of them accepted, the first
        `forced` of them forced by a grammar."""
        if proposed == 0:
            return
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        self.forced_tokens += min(accepted, forced)
        while len(self.proposed_at) < proposed:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for i in range(proposed):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens each verification step yields: the accepted ones plus the one the target adds."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else 0.0

    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]
