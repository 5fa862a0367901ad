"""A conversation of a multi-turn workload: a system prompt, turns of user text (or, in an agent loop,
tool results), and the request each turn sends: the whole history so far, with the answers the server
gave to the earlier turns, as a chat client replays it; or, a turn chained to the previous answer (the
Responses API's previous_response_id), only what is new since that answer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmopt.bench.workload.bench_request import BenchRequest


@dataclass
class ToolCall:
    """An assistant's call of a tool (the agent workload writes these: a small model's own calls are
    no reliable loop), kept in the history before its result."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def message(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def as_text(self) -> str:
        """The call written into an assistant's text, for a server that takes no `tools`."""
        return f'<tool_call>{{"name": "{self.name}", "arguments": {self.arguments}}}</tool_call>'


@dataclass
class Turn:
    text: str  # the user's message, or the tool's result when `tool_call` is set
    max_tokens: int
    tokens: int = 0  # `text` in the local tokenizer's tokens
    tool_call: ToolCall | None = None  # the call (made after the previous answer) that `text` answers


@dataclass
class Conversation:
    turns: list[Turn]
    system: str | None = None
    system_tokens: int = 0
    tools: list[dict] | None = field(default=None)  # sent as `tools` while the server takes them

    def messages(self, k: int, answers: list[str], tools: bool) -> list[dict]:
        """The chat messages of turn `k`: system, then each earlier turn's input and answer, then turn
        k's input. An agent turn's input is the assistant's tool call and the tool's result: as OpenAI
        messages when `tools`, else written as text (the call in the assistant's text, the result as
        the user's message)."""
        assert len(answers) >= k, "a turn is sent only after every earlier turn was answered"
        out = [{"role": "system", "content": self.system}] if self.system else []
        for j in range(k + 1):
            turn = self.turns[j]
            if j:
                out.append(assistant_message(answers[j - 1], turn.tool_call, tools))
            out.append(input_message(turn, tools))
        return out

    def new_messages(self, k: int, tools: bool) -> list[dict]:
        """What turn `k` adds to the conversation after the server's answer to turn k-1 (which the
        server keeps): the system prompt (a chained request names it again, as the Responses API asks),
        then an agent's tool call and the tool's result, or the user's text. With tools as text the call
        is an assistant message of its own, where a replay writes it after the answer's text."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        turn = self.turns[k]
        if k and turn.tool_call is not None:
            out.append(assistant_message("", turn.tool_call, tools))
        return [*out, input_message(turn, tools)]

    def request(
        self,
        k: int,
        answers: list[str],
        answer_tokens: int,
        tools: bool,
        previous_response_id: str | None = None,
    ) -> BenchRequest:
        """Turn `k`'s request; `answer_tokens` counts the earlier answers' tokens (the server's counts).
        With `previous_response_id` (the server's id of turn k-1's answer) it sends only what is new."""
        prompt_tokens = self.system_tokens + sum(t.tokens for t in self.turns[: k + 1]) + answer_tokens
        chained = previous_response_id is not None
        return BenchRequest(
            messages=self.new_messages(k, tools) if chained else self.messages(k, answers, tools),
            max_tokens=self.turns[k].max_tokens,
            prompt_tokens=prompt_tokens,
            tools=self.tools if tools else None,
            previous_response_id=previous_response_id,
        )


def assistant_message(answer: str, call: ToolCall | None, tools: bool) -> dict:
    if call is None:
        return {"role": "assistant", "content": answer}
    if tools:
        return {"role": "assistant", "content": answer, "tool_calls": [call.message()]}
    return {"role": "assistant", "content": (answer + "\n" if answer else "") + call.as_text()}


def input_message(turn: Turn, tools: bool) -> dict:
    if turn.tool_call is None:
        return {"role": "user", "content": turn.text}
    if tools:
        return {"role": "tool", "tool_call_id": turn.tool_call.id, "content": turn.text}
    return {"role": "user", "content": f"<tool_response>\n{turn.text}\n</tool_response>"}


def tool_definitions_text(tools: list[dict]) -> str:
    """Tool definitions as an agent's system prompt lists them."""
    return "\n".join(json.dumps(t["function"]) for t in tools)
