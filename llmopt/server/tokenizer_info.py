"""GET /tokenizer_info as vLLM answers it: the tokenizer's configuration (tokenizer_config.json's
fields: special tokens, model_max_length), its class and chat template, so that a client can tokenize
and template as the server does. lm-evaluation-harness's default remote tokenizer reads `eos_token`,
`bos_token`, `pad_token` and `chat_template` from it and counts with /tokenize and /detokenize."""

from __future__ import annotations


def tokenizer_info(tokenizer, max_model_len: int) -> dict:
    """The info of `tokenizer` (a transformers tokenizer); `model_max_length` is what this server serves
    (--max-model-len), not the tokenizer's own figure, since that is the limit a client meets."""
    kwargs = getattr(tokenizer, "init_kwargs", None) or {}
    # File paths say where the server keeps its files and help no client.
    info = {k: json_value(v) for k, v in kwargs.items() if not k.endswith("_file") and k != "name_or_path"}
    for name, token in (getattr(tokenizer, "special_tokens_map", None) or {}).items():
        info.setdefault(name, json_value(token))
    info["tokenizer_class"] = type(tokenizer).__name__
    info["model_max_length"] = max_model_len
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        info["chat_template"] = template
    return info


def json_value(value: object) -> object:
    """`value` as JSON takes it: an AddedToken as its text (vLLM's rule), containers walked, anything else
    that is no JSON value as its str()."""
    if hasattr(value, "content") and isinstance(value.content, str):
        return value.content
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
