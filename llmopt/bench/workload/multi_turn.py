"""The multi-turn workload: synthetic chat sessions. Every session of a point shares one system prompt
(`system_len` tokens) and has `turns` turns of user text (`turn_len` tokens each, ± the prompt-length
spread); each turn asks for `output_len` tokens and replays the whole history (conversation.py)."""

from __future__ import annotations

from llmopt.bench.workload.conversation import Conversation, Turn
from llmopt.bench.workload.random import random_prompts


def multi_turn_conversations(
    tokenizer,
    num: int,
    system_len: int,
    turn_len: int,
    output_len: int,
    turns: int,
    seed: int = 0,
    spread: float = 0.0,
) -> list[Conversation]:
    """`num` sessions of `turns` turns, their texts cut from random places of the corpus."""
    system = random_prompts(tokenizer, 1, system_len, 1, seed)[0] if system_len else None
    texts = random_prompts(tokenizer, num * turns, turn_len, output_len, seed + 1, spread)
    return [
        Conversation(
            turns=[Turn(t.prompt, output_len, t.prompt_tokens) for t in texts[i * turns : (i + 1) * turns]],
            system=system.prompt if system else None,
            system_tokens=system.prompt_tokens if system else 0,
        )
        for i in range(num)
    ]
