"""A step cost under which speculation's policy takes every position offered, for the tests that check the
proposers and the verifier at work however little their proposals would pay."""

from __future__ import annotations

from llmopt.engine.llm import LLM
from llmopt.engine.spec_decode.step_cost import StepCost


class FreeRows(StepCost):
    """A step that costs the same whatever it verifies and however deep it drafts."""

    def proposing(self, rows: int, depth: int) -> float:
        return 1.0


def verifying_everything(llm: LLM) -> LLM:
    llm.engine.speculator.cost = FreeRows()
    return llm
