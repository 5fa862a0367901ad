"""A conversation's shape: how many turns, what each turn adds, and how its prompts grow.

Every turn replays the whole history (the earlier messages and answers) before its new tokens, as chat
APIs and agent loops do: turn k (1-based) sends k * prompt + (k - 1) * output tokens. Under a token
price a conversation's cost therefore grows with the square of its turns, under a price per request
linearly; llmopt/cost/break_even.py solves for the turn where they cross.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmopt.pricing import Usage


@dataclass(frozen=True)
class ConversationShape:
    """`turns` requests, each adding `prompt_tokens` new tokens (a user message, a tool result) to the
    replayed history and answering with `output_tokens`. `cached_fraction` of every prompt is read from
    the provider's prompt cache, and then the rest of it is written to the cache (billed at the
    cache-write price where one is charged): a client that caches marks every request's end as a cache
    point, since it cannot know which turn is the last.
    """

    prompt_tokens: float
    output_tokens: float
    turns: int = 1
    cached_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if self.turns < 1:
            raise ValueError("a conversation has at least one turn")
        if not 0 <= self.cached_fraction <= 1:
            raise ValueError("the cached fraction is between 0 and 1")

    @property
    def writes(self) -> bool:
        """Whether requests write their uncached prompt to the cache: whenever caching is used at all."""
        return self.cached_fraction > 0

    def turn_prompt(self, k: int) -> float:
        """Prompt tokens of turn k (1-based): the history so far plus this turn's new tokens."""
        assert k >= 1
        return k * self.prompt_tokens + (k - 1) * self.output_tokens

    def turn_usage(self, k: int) -> Usage:
        """Turn k's tokens (1-based) as a provider bills them."""
        prompt = self.turn_prompt(k)
        cached = self.cached_fraction * prompt
        return Usage(prompt, self.output_tokens, cached, prompt - cached if self.writes else 0.0)

    def usages(self) -> list[Usage]:
        """Every turn's tokens as a provider bills them."""
        return [self.turn_usage(k) for k in range(1, self.turns + 1)]

    def with_turns(self, turns: int) -> ConversationShape:
        return ConversationShape(self.prompt_tokens, self.output_tokens, turns, self.cached_fraction)
