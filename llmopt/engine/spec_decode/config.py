"""`--speculative-config`, vLLM-style JSON: method, k, n-gram bounds, draft model; or `auto`."""

from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = ("ngram", "draft")
# keys whose defaults are the dataclass's
OPTIONAL = ("prompt_lookup_min", "prompt_lookup_max", "model", "draft_weights")
# "q4_0": a GGUF draft's linears on a finer grid than Q4_0 (Q5_0, Q8_0, Q6_K ...) requantized to it once, at
# its first load (formats/gguf.py): a draft step is a read of its weights, and the 0.5B Qwen2.5-Coder's went
# from 394 to 279 MB a step for top-1 agreement with the 1.5B's greedy tokens of 92.6 % against 93.1 % on
# code (78.9 against 81.8 on chat). "file": as the file stores them.
DRAFT_WEIGHTS = ("q4_0", "file")
# num_speculative_tokens where the JSON leaves it out (vLLM asks for it; the policy takes only the positions
# that pay, so it is the deepest a step may go): prompt lookup as deep as `auto`; a draft 4, at which the 0.5B
# Qwen2.5-Coder drafting for the 1.5B ran code 1.71x (benchmarks/draft_model.py, 88 % accepted).
DEFAULT_TOKENS = {"ngram": 7, "draft": 4}


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2  # single-token matches are mostly noise in free text
    prompt_lookup_max: int = 4
    model: str | None = None  # the draft model: any model llmopt loads
    draft_weights: str = "q4_0"  # one of DRAFT_WEIGHTS
    # `auto`: chosen by llmopt, not asked for, so it speculates only for greedy requests. A sampled
    # request's random draws follow what is verified, which the policy picks from measured timings: a
    # seeded request would no longer reproduce its text.
    greedy_only: bool = False

    @classmethod
    def parse(cls, value: str | dict | None) -> SpeculativeConfig | None:
        """From vLLM-style JSON, e.g. '{"method": "ngram", "num_speculative_tokens": 4}' (k defaults to
        DEFAULT_TOKENS), or "auto";
        "off" (or nothing) is no speculation."""
        if value is None or value in ("", "off"):
            return None
        if value == "auto":
            # Prompt lookup costs nothing to propose; as deep as a decode verification goes (1 + 7 rows),
            # the policy (policy.py) taking only the positions that pay at the measured step cost.
            return cls(
                "ngram", DEFAULT_TOKENS["ngram"], prompt_lookup_min=2, prompt_lookup_max=4, greedy_only=True
            )
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative config is not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValueError("speculative config must be a JSON object")
        unknown = set(value) - {"method", "num_speculative_tokens", *OPTIONAL}
        if unknown:
            raise ValueError(f"unknown speculative config keys: {', '.join(sorted(unknown))}")
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, not {method!r}")
        k = value.get("num_speculative_tokens", DEFAULT_TOKENS[method])
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError("num_speculative_tokens must be an integer >= 1")
        config = cls(method=method, num_speculative_tokens=k, **{n: value[n] for n in OPTIONAL if n in value})
        if not 1 <= config.prompt_lookup_min <= config.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if config.draft_weights not in DRAFT_WEIGHTS:
            raise ValueError(
                f"draft_weights must be one of {', '.join(DRAFT_WEIGHTS)}, not {config.draft_weights!r}"
            )
        if method == "draft" and not config.model:
            raise ValueError('the draft method needs "model": a model folder, .gguf file or alias')
        return config
