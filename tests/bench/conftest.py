"""Fixtures for the bench's fast tier: a tokenizer folder made here (no model weights, no config.json)
and a scripted OpenAI-compatible endpoint on 127.0.0.1 (no model, no llmopt server)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmopt.corpus import default_text


def save_word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer of the default corpus, saved as transformers saves one: tokenizer.json and
    tokenizer_config.json, nothing else. Every corpus word is in its vocabulary, so the workloads can
    cut prompts of an exact token length from the corpus with it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        default_text().splitlines(), trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_word_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tok")


class ScriptedOpenAI(http.server.BaseHTTPRequestHandler):
    """A stand-in for an OpenAI-compatible server: /v1/models lists one model, and both completion
    routes stream `max_tokens` one-word chunks, then the usage. Every request's path and body is kept
    in `seen`, so a test can check what the bench sent."""

    seen: list[tuple[str, dict]]

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, request))
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self.send_error(404)
            return
        chat = self.path == "/v1/chat/completions"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(request["max_tokens"]):
            choice = {"index": 0, "delta": {"content": "word "}} if chat else {"index": 0, "text": "word "}
            self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 10, "completion_tokens": request["max_tokens"]}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


@dataclass
class Endpoint:
    url: str  # the API base, .../v1
    seen: list[tuple[str, dict]]  # (path, body) of every completion request, in arrival order


@pytest.fixture
def openai_endpoint() -> Iterator[Endpoint]:
    seen: list[tuple[str, dict]] = []
    handler = type("Handler", (ScriptedOpenAI,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Endpoint(f"http://127.0.0.1:{server.server_address[1]}/v1", seen)
    finally:
        server.shutdown()
        server.server_close()
