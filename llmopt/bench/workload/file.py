"""The file workload: prompts from a JSONL file or a ShareGPT JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from llmopt.bench.workload.bench_request import BenchRequest
from llmopt.bench.workload.text import count_tokens
from llmopt.files import jsonl_records


def file_prompts(
    path: Path, tokenizer, default_output_len: int, num: int | None = None
) -> list[BenchRequest]:
    """JSONL lines of {"prompt" | "messages", "max_tokens"?, "tools"?, "response_format"?}, or a ShareGPT
    JSON file (a list of {"conversations": [{"from": "human"|"gpt", "value"}...]}: the first human turn
    is the prompt and the first answer's length the output length, as `vllm bench serve` does)."""
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    text = path.read_text()
    if text.lstrip().startswith("["):
        out = sharegpt_prompts(json.loads(text), tokenizer)
    else:
        out = jsonl_prompts(path, text, tokenizer, default_output_len)
    if not out:
        raise ValueError(f"{path} holds no usable prompts")
    return out[:num] if num else out


def sharegpt_prompts(conversations: list[dict], tokenizer) -> list[BenchRequest]:
    out = []
    for conv in conversations:
        turns = conv.get("conversations") or conv.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, answer = turns[0].get("value", ""), turns[1].get("value", "")
        output_len = max(1, count_tokens(tokenizer, answer))
        out.append(
            BenchRequest(prompt=prompt, max_tokens=output_len, prompt_tokens=count_tokens(tokenizer, prompt))
        )
    return out


def jsonl_prompts(path: Path, text: str, tokenizer, default_output_len: int) -> list[BenchRequest]:
    out = []
    for n, item in jsonl_records(path, text):
        if not isinstance(item, dict) or not ({"prompt", "messages"} & set(item)):
            raise ValueError(f'{path}:{n}: each line needs "prompt" or "messages"')
        messages = item.get("messages")
        prompt = item.get("prompt")
        response_format = item.get("response_format")
        if response_format is not None and not (
            isinstance(response_format, dict)
            and response_format.get("type") in ("json_schema", "json_object", "text")
        ):
            raise ValueError(f'{path}:{n}: "response_format" takes OpenAI\'s {{"type": "json_schema", ...}}')
        if response_format is not None and response_format["type"] == "text":
            response_format = None  # free text: nothing to check
        content = prompt if prompt is not None else " ".join(m.get("content", "") for m in messages)
        out.append(
            BenchRequest(
                prompt=prompt,
                messages=messages,
                max_tokens=int(item.get("max_tokens", default_output_len)),
                prompt_tokens=count_tokens(tokenizer, content),
                tools=item.get("tools"),
                response_format=response_format,
            )
        )
    return out
