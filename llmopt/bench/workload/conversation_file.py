"""The conversations workload: multi-turn sessions from a file, every turn of each. A ShareGPT JSON file
(a list of {"conversations": [{"from": "system"|"human"|"gpt", "value"}...]}), or JSONL with one
conversation a line: OpenAI-style {"messages": [{"role", "content"}...]} or a ShareGPT entry. User turns
become the session's turns; the length of the answer that follows each (in the local tokenizer's tokens)
is its `max_tokens`, the output length otherwise. The server's own answers, not the file's, go back in
the history, as for synthetic sessions. A bad entry is an error naming its line (or its place in a list)."""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.bench.workload.conversation import Conversation, Turn
from llmopt.bench.workload.text import count_tokens
from llmopt.files import jsonl_records

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def file_conversations(
    path: Path, tokenizer, default_output_len: int, num: int | None = None
) -> list[Conversation]:
    if not path.is_file():
        raise ValueError(f"conversation file not found: {path}")
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        where = [(f"{path}: conversation #{i + 1}", entry) for i, entry in enumerate(entries)]
    else:
        where = [(f"{path}:{n}", entry) for n, entry in jsonl_records(path, text)]
    out = []
    for place, entry in where:
        try:
            out.append(conversation(entry, tokenizer, default_output_len))
        except ValueError as exc:
            raise ValueError(f"{place}: {exc}") from None
    if not out:
        raise ValueError(f"{path} holds no conversations")
    return out[:num] if num else out


def conversation(entry: object, tokenizer, default_output_len: int) -> Conversation:
    """One file entry as a conversation; ValueError saying what is wrong with it."""
    messages = chat_messages(entry)
    system = "\n".join(m["content"] for m in messages if m["role"] == "system") or None
    turns: list[Turn] = []
    for i, m in enumerate(messages):
        if m["role"] != "user":
            continue
        answer = messages[i + 1] if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant" else None
        max_tokens = max(1, count_tokens(tokenizer, answer["content"])) if answer else default_output_len
        turns.append(Turn(m["content"], max_tokens, count_tokens(tokenizer, m["content"])))
    if not turns:
        raise ValueError("no user turn")
    return Conversation(turns, system, count_tokens(tokenizer, system) if system else 0)


def chat_messages(entry: object) -> list[dict]:
    """[{"role", "content"}, ...] of an OpenAI-style or ShareGPT entry, checked."""
    if isinstance(entry, dict) and isinstance(entry.get("messages"), list):
        raw = [
            (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
            for m in entry["messages"]
        ]
    elif isinstance(entry, dict) and isinstance(
        entry.get("conversations") or entry.get("conversation"), list
    ):
        turns = entry.get("conversations") or entry.get("conversation")
        raw = [
            (SHAREGPT_ROLES.get(t.get("from")), t.get("value")) if isinstance(t, dict) else (None, None)
            for t in turns
        ]
    else:
        raise ValueError('an entry needs "messages" (OpenAI style) or "conversations" (ShareGPT), a list')
    for n, (role, content) in enumerate(raw, 1):
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise ValueError(f"message {n}: needs a role of system, user or assistant and a text content")
    return [{"role": role, "content": content} for role, content in raw]
