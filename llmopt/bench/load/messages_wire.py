"""What Anthropic's Messages API looks like to the bench: a request's body (the system prompt apart,
text and tool_use / tool_result blocks, tools with input_schema), and what an answer says: its text
(text deltas, a tool call's name and input_json pieces), its usage in chat's shape (the prompt is
input_tokens + cache_read_input_tokens + cache_creation_input_tokens, the cached part the cache read,
the written part the cache creation), why it ended and its id. llmopt, llama.cpp's server, vLLM and
Anthropic's own API are measured the same way."""

from __future__ import annotations

import json

from llmopt.bench.load.wire import WireError, WireEvent

ANTHROPIC_VERSION = "2023-06-01"
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def messages_payload(model: str, req, stream: bool, ignore_eos: bool) -> dict:
    """The body of `req` (a BenchRequest) for POST /messages."""
    chat = req.messages or [{"role": "user", "content": req.prompt or ""}]
    system = [m["content"] for m in chat if m["role"] == "system"]
    body: dict = {
        "model": model,
        "max_tokens": req.max_tokens,
        "messages": anthropic_messages([m for m in chat if m["role"] != "system"]),
        "temperature": 0,
        "stream": stream,
    }
    if system:
        body["system"] = "\n\n".join(system)
    if req.tools:
        body["tools"] = [anthropic_tool(t) for t in req.tools]
    if req.response_format:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema_of(req.response_format)}}
    elif ignore_eos:
        body["ignore_eos"] = True
    return body


def anthropic_messages(messages: list[dict]) -> list[dict]:
    """Chat messages as Anthropic's: an assistant's tool calls as tool_use blocks after its text, tool
    messages as tool_result blocks of one user turn."""
    out: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif message.get("tool_calls"):
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message["tool_calls"]:
                function = call["function"]
                arguments = json.loads(function["arguments"] or "{}")
                blocks.append(
                    {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": role, "content": content})
    return out


def anthropic_tool(tool: dict) -> dict:
    function = tool["function"]
    out = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def schema_of(response_format: dict) -> dict:
    if response_format.get("type") == "json_schema":
        return response_format["json_schema"]["schema"]
    return {"type": "object"}  # json_object: any object


class MessagesStream:
    """One streamed answer's events: usage comes in two parts (message_start's, then message_delta's
    final counts, each field overwriting), so this reader keeps what it has seen."""

    def __init__(self) -> None:
        self.usage: dict = {}

    def event(self, data: dict) -> WireEvent:
        kind = data.get("type")
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            return WireEvent(text=str(delta.get("text") or delta.get("partial_json") or ""))
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            return WireEvent(text=str(block.get("name") or "") if block.get("type") == "tool_use" else "")
        if kind == "message_start":
            message = data.get("message") or {}
            self.merge(message.get("usage"))
            return WireEvent(response_id=message.get("id"))
        if kind == "message_delta":
            self.merge(data.get("usage"))
            reason = (data.get("delta") or {}).get("stop_reason")
            return WireEvent(usage=chat_usage(self.usage), finish_reason=FINISH.get(reason, reason))
        if kind == "message_stop":
            return WireEvent(done=True)
        if kind == "error":
            error = data.get("error") or {}
            raise WireError(
                f"stream error: {error.get('message', error) if isinstance(error, dict) else error}"
            )
        return WireEvent()

    def merge(self, usage: object) -> None:
        if isinstance(usage, dict):
            self.usage.update({k: v for k, v in usage.items() if v is not None})


def messages_whole(answer: dict) -> WireEvent:
    """What a whole (non-streamed) message says."""
    if answer.get("type") != "message" or not isinstance(answer.get("content"), list):
        raise WireError(f"malformed answer: not a message: {str(answer)[:100]}")
    text = ""
    for block in answer["content"]:
        if isinstance(block, dict) and block.get("type") == "text":
            text += str(block.get("text") or "")
        elif isinstance(block, dict) and block.get("type") == "tool_use":
            text += str(block.get("name") or "") + json.dumps(block.get("input") or {})
    reason = answer.get("stop_reason")
    return WireEvent(
        text, chat_usage(answer.get("usage")), FINISH.get(reason, reason), answer.get("id"), True
    )


def chat_usage(usage: object) -> dict | None:
    """Anthropic's usage in chat's shape, which the bench's records read: its input_tokens leave out
    what the cache served and what was written to it."""
    if not isinstance(usage, dict):
        return None
    counts = [
        usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ]
    if counts[0] is None or not all(c is None or isinstance(c, int) for c in counts):
        return {"prompt_tokens": counts[0], "completion_tokens": usage.get("output_tokens")}
    uncached, read, written = (c or 0 for c in counts)
    return {
        "prompt_tokens": uncached + read + written,
        "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
    }
