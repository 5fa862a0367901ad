"""The agent workload: multi-turn sessions of an agent loop. The system prompt lists tool definitions
(then corpus text up to `system_len` tokens), requests send the same tools as `tools`, and every turn
after the first is an assistant tool call followed by the tool's result (`turn_len` tokens) in the
history, as an agent sends them back (conversation.py; a server that refuses `tools` gets them as text,
and a recipe's `tools = "text"` writes them as text for every server)."""

from __future__ import annotations

import json

from llmopt.bench.workload.conversation import Conversation, ToolCall, tool_definitions_text
from llmopt.bench.workload.multi_turn import multi_turn_conversations
from llmopt.bench.workload.random import random_prompts
from llmopt.bench.workload.text import count_tokens


def function(name: str, description: str, parameter: str) -> dict:
    parameters = {
        "type": "object",
        "properties": {parameter: {"type": "string", "description": f"the {parameter}"}},
        "required": [parameter],
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    function("search_docs", "Search the project documentation and return the best passages.", "query"),
    function("read_file", "Return the text of a file of the repository.", "path"),
    function(
        "run_tests", "Run the test suite, or the tests matching a pattern, and return the output.", "pattern"
    ),
]
SYSTEM_HEADER = (
    "You are a coding agent. Call one of these tools when it helps, then answer briefly.\n"
    "Tools (JSON schema):\n"
)


def agent_conversations(
    tokenizer,
    num: int,
    system_len: int,
    turn_len: int,
    output_len: int,
    turns: int,
    seed: int = 0,
    spread: float = 0.0,
    tools: str = "api",
) -> list[Conversation]:
    """`num` agent sessions: the multi-turn workload's texts, the later turns' texts as tool results.
    `tools` "text": no `tools` field, the calls and results written into the messages (the system
    prompt lists the tools either way), so that every server gets the same bytes whatever its tool
    support (an engine comparison's agent point: recipes/engines-agent.toml)."""
    header = SYSTEM_HEADER + tool_definitions_text(TOOLS) + "\n\n"
    filler_len = max(0, system_len - count_tokens(tokenizer, header))
    filler = random_prompts(tokenizer, 1, filler_len, 1, seed)[0].prompt if filler_len else ""
    system = header + filler  # at least the tool definitions, however short `system_len` is
    words = random_prompts(tokenizer, num * turns, 4, 1, seed + 2)
    out = []
    for i, conv in enumerate(
        multi_turn_conversations(tokenizer, num, 0, turn_len, output_len, turns, seed, spread)
    ):
        for k, turn in enumerate(conv.turns[1:], 1):
            tool = TOOLS[(i + k) % len(TOOLS)]["function"]
            parameter = tool["parameters"]["required"][0]
            arguments = json.dumps({parameter: words[i * turns + k].prompt.strip()})
            turn.tool_call = ToolCall(f"call_{k}", tool["name"], arguments)
        conv.system, conv.system_tokens = system, count_tokens(tokenizer, system)
        conv.tools = TOOLS if tools == "api" else None
        out.append(conv)
    return out
