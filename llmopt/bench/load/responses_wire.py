"""What OpenAI's Responses API looks like to the bench: a request's body (chat messages as `instructions`
and input items, tools in the flat shape, `previous_response_id` for a chained turn), and what an answer
says: its text (output_text and function-call deltas, a call's name with its first piece, as chat's
tool-call text counts), its usage in chat's shape (input_tokens_details.cached_tokens as
prompt_tokens_details.cached_tokens), why it ended and its id. Any server that serves /v1/responses
(llmopt, vLLM, llama.cpp, OpenAI) is measured the same way."""

from __future__ import annotations

from llmopt.bench.load.wire import WireError, WireEvent

FINISHED = ("response.completed", "response.incomplete")


def responses_payload(model: str, req, stream: bool, ignore_eos: bool) -> dict:
    """The body of `req` (a BenchRequest) for POST /responses."""
    messages = req.messages or [{"role": "user", "content": req.prompt or ""}]
    instructions = [m["content"] for m in messages if m["role"] == "system"]
    body: dict = {
        "model": model,
        "input": input_items([m for m in messages if m["role"] != "system"]),
        "max_output_tokens": req.max_tokens,
        "temperature": 0,
        "stream": stream,
        # Stored only where a later turn continues it: an unchained request must leave nothing behind.
        "store": req.store,
    }
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if req.previous_response_id:
        body["previous_response_id"] = req.previous_response_id
    if req.tools:
        body["tools"] = [flat_tool(t) for t in req.tools]
    if req.response_format:
        body["text"] = {"format": text_format(req.response_format)}
    elif ignore_eos:
        body["ignore_eos"] = True
    return body


def input_items(messages: list[dict]) -> list[dict]:
    """Chat messages as Responses input items: an assistant's tool calls as function_call items after
    its text, a tool message as a function_call_output item."""
    items: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": content}
            )
            continue
        if content or not message.get("tool_calls"):
            items.append({"type": "message", "role": role, "content": content or ""})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


def flat_tool(tool: dict) -> dict:
    function = tool["function"]
    return {"type": "function", **function}


def text_format(response_format: dict) -> dict:
    if response_format.get("type") == "json_schema":
        spec = response_format["json_schema"]
        return {"type": "json_schema", "name": spec.get("name", "answer"), "schema": spec["schema"]}
    return {"type": response_format.get("type", "text")}


def responses_event(data: dict) -> WireEvent:
    """What one streamed event adds."""
    kind = data.get("type")
    if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        return WireEvent(text=str(data.get("delta") or ""))
    if kind == "response.output_item.added":
        item = data.get("item") or {}
        return WireEvent(text=str(item.get("name") or "") if item.get("type") == "function_call" else "")
    if kind == "response.created":
        return WireEvent(response_id=(data.get("response") or {}).get("id"))
    if kind in FINISHED:
        return finished(data.get("response") or {}, done=True)
    if kind in ("response.failed", "error"):
        error = (data.get("response") or {}).get("error") or data.get("error") or data
        message = error.get("message", error) if isinstance(error, dict) else error
        raise WireError(f"stream error: {message}")
    return WireEvent()


def responses_whole(answer: dict) -> WireEvent:
    """What a whole (non-streamed) response says."""
    if answer.get("object") != "response" or not isinstance(answer.get("output"), list):
        raise WireError(f"malformed answer: not a response object: {str(answer)[:100]}")
    return finished(answer, done=True, with_text=True)


def finished(response: dict, done: bool, with_text: bool = False) -> WireEvent:
    output = response.get("output") or []
    calls = [item for item in output if isinstance(item, dict) and item.get("type") == "function_call"]
    text = ""
    if with_text:
        for item in output:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                text += "".join(
                    str(p.get("text") or "") for p in item.get("content") or [] if isinstance(p, dict)
                )
            elif item.get("type") == "function_call":
                text += str(item.get("name") or "") + str(item.get("arguments") or "")
    status = response.get("status")
    finish = "length" if status == "incomplete" else "tool_calls" if calls else "stop"
    usage = chat_usage(response.get("usage"))
    return WireEvent(text, usage, finish, response.get("id"), done)


def chat_usage(usage: object) -> dict | None:
    """Responses usage in chat's shape, which the bench's records read."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens_details": {
            "cached_tokens": details.get("cached_tokens"),
            "disk_cached_tokens": details.get("disk_cached_tokens"),  # llmopt serve's disk tier
        },
    }
