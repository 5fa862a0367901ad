from __future__ import annotations

from dataclasses import dataclass, field

from llmopt.engine.structured.request import StructuredOutput
from llmopt.engine.token_logprobs import MAX_LOGPROBS

# Temperatures below this sample greedily, as vLLM does: dividing logits by 1e-39 overflows to inf and
# the softmax to NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """Per-request decoding settings (the OpenAI/vLLM subset the engine honours)."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW_TEMPERATURE) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    structured_output: StructuredOutput | None = None  # the grammar the output follows (xgrammar)
    forced_tokens: bool = True  # propose the tokens the grammar forces (spec_decode/forced.py)
    # Penalties and bias (penalties.py), with OpenAI's and vLLM's bounds.
    frequency_penalty: float = 0.0  # [-2, 2]
    presence_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # (0, 2]; 1: off
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> [-100, 100]
    min_p: float = 0.0  # [0, 1]: drop tokens less likely than min_p x the most likely one
    # Logprobs (logprobs.py): None for none, else how many of the most likely tokens to add (0-20).
    logprobs: int | None = None  # of each output token
    prompt_logprobs: int | None = None  # of each prompt token (max_tokens may then be 0)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        # max_tokens 0 scores a prompt without generating (echo with max_tokens 0, as eval harnesses send).
        if self.max_tokens < (0 if self.prompt_logprobs is not None else 1):
            raise ValueError(
                f"max_tokens must be at least 1 (0 only with prompt_logprobs), got {self.max_tokens}"
            )
        self._check_penalties_and_logprobs()
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (or -1 for off), got {self.top_k}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if self.structured_output is not None and self.min_tokens > 0:
            # Where the grammar is complete only a stop token may follow, and min_tokens would ban it.
            raise ValueError("min_tokens cannot be combined with a structured output")

    def _check_penalties_and_logprobs(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if any(not -100 <= v <= 100 for v in self.logit_bias.values()):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        """Whether penalties.py changes this request's logits."""
        return bool(
            self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1 or self.logit_bias
        )
