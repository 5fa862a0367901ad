"""Schemathesis against a live `llmopt serve` on the real model: whatever a client sends to any route,
valid or not, the answer is never a 5xx, the server stays healthy and no KV block leaks.

Schemathesis is driven from Python rather than through its pytest plugin, so that one test can count
every case it sends: its coverage phase (deterministic boundary values, missing and wrong-typed fields,
unexpected methods and content types) for every operation, then its fuzzing phase (Hypothesis drawing
positive and negative bodies) for the operations that take one. Cases are sent by a small thread pool
while Hypothesis draws the next ones. `benchmarks/fuzz.py` runs the same driver with more cases."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.core import NotSet
from schemathesis.schemas import APIOperation, BaseSchema

from tests.conftest import API_KEY, LiveServer

MAX_MODEL_LEN = 48
# Every accepted request is cheap: at most 48 tokens of context, so even a request the fuzzer leaves
# uncapped (a chat without max_tokens gets the rest of the context) ends within a few dozen steps.
SERVER_ARGS = (
    "--api-key",
    API_KEY,
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--num-kv-blocks",
    "64",
    "--max-num-seqs",
    "16",
)
MIN_CASES = 2000
# Asked for with a margin: Hypothesis may draw a few fewer than max_examples (duplicates it skips).
REQUESTED_CASES = 2100
DEADLINE_S = 270  # the CI budget is about 5 minutes; what is left covers the server's start and checks
REQUEST_TIMEOUT_S = 60  # a request without an answer by then counts as lost, as a 5xx does

# Body fields that set how much work a valid request asks for: (cheap limit, upper bound). A value in
# (limit, bound] is folded into 1..limit so that valid requests finish in a few steps; a value above the
# bound is refused by the server at once (beyond the context, or beyond n's maximum of 16), and one below
# 1 or of another type is invalid: those are left as generated, since invalid inputs are the point.
CHEAP_FIELDS: dict[str, tuple[int, int]] = {
    "max_tokens": (4, MAX_MODEL_LEN),
    "max_completion_tokens": (4, MAX_MODEL_LEN),
    "max_output_tokens": (4, MAX_MODEL_LEN),  # the Responses API's
    "min_tokens": (4, MAX_MODEL_LEN),
    "n": (2, 16),
}


def make_cheap(case: Case, fill_missing: bool) -> Case:
    """The case map applied to every generated case before it is sent (see CHEAP_FIELDS). With
    `fill_missing`, a body that sets no output length gets max_tokens 2 (max_completion_tokens for a
    chat): left out, it asks for 16 tokens (completions) or the rest of the context (chat), and those
    few hundred cases alone took most of the run. The coverage phase's bodies keep their missing
    fields, so the defaults are still fuzzed, a few hundred cases long."""
    body = case.body
    if not isinstance(body, dict):
        return case
    for name, (limit, bound) in CHEAP_FIELDS.items():
        value = body.get(name)
        # bool is an int to Python but not to the server's schema: a generated `true` stays invalid.
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and math.isfinite(value) and value == int(value) and limit < value <= bound:
            body[name] = type(value)(1 + int(value) % limit)  # an integral float stays a float
    if fill_missing and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_completion_tokens" if "messages" in body else "max_tokens"] = 2
    return case


@dataclass
class FuzzReport:
    cases: int = 0
    coverage_cases: int = 0
    fuzzing_cases: int = 0
    seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> count
    operations: Counter = field(default_factory=Counter)  # "POST /v1/completions" -> count
    # Each a reproducible request with what came back: a 5xx status, a stream's server-error event
    # (the status line was 200, long sent), or no answer at all (a connection error or timeout).
    server_errors: list[dict] = field(default_factory=list)
    no_answer: list[dict] = field(default_factory=list)
    seed: int | None = None

    def status_classes(self) -> dict[str, int]:
        classes: Counter = Counter()
        for status, count in self.statuses.items():
            classes[f"{status // 100}xx"] += count
        return dict(sorted(classes.items()))

    def server_error_kinds(self) -> dict[str, int]:
        """How many server errors each distinct answer had: usually one bug behind many cases."""
        return dict(Counter(e["response"][:300] for e in self.server_errors).most_common())

    def brief(self, examples: int = 5) -> str:
        """The counts, the kinds of server error, and the first few requests that failed (the shortest
        bodies first: the easiest to read and replay)."""
        data = self.to_dict()
        shortest = sorted(self.server_errors, key=lambda e: len(str(e["request"]["body"])))
        data["server_errors"] = shortest[:examples]
        data["no_answer"] = self.no_answer[:examples]
        return json.dumps(data, indent=1)

    def to_dict(self) -> dict:
        return {
            "cases": self.cases,
            "coverage_cases": self.coverage_cases,
            "fuzzing_cases": self.fuzzing_cases,
            "seconds": round(self.seconds, 2),
            "cases_per_s": round(self.cases / self.seconds, 1) if self.seconds else None,
            "status_classes": self.status_classes(),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "operations": dict(self.operations),
            "server_error_kinds": self.server_error_kinds(),
            "server_errors": self.server_errors,
            "no_answer": self.no_answer,
            "seed": self.seed,
        }


def describe(case: Case) -> dict:
    """The request as sent, without the API key: enough to replay it with curl or httpx."""
    body = None if isinstance(case.body, NotSet) else case.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    elif body is not None and (case.media_type or "").endswith("json"):
        body = json.dumps(body)  # the JSON text itself: lone surrogates and odd floats survive as escapes
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    return {"method": case.method, "path": case.formatted_path, "query": case.query or None,
            "headers": headers or None, "media_type": case.media_type, "body": body}  # fmt: skip


def stream_server_error(response: schemathesis.Response) -> str | None:
    """The first server-error event of an SSE body (the engine failed after the 200 was sent)."""
    if not any("text/event-stream" in v for v in response.headers.get("content-type", [])):
        return None
    for line in response.content.decode(errors="replace").splitlines():
        if not line.startswith("data: {"):
            continue
        try:
            error = json.loads(line[len("data: ") :]).get("error")
        except json.JSONDecodeError:
            return f"an event that is not JSON: {line[:200]}"
        if not isinstance(error, dict):
            continue
        code = error.get("code")  # our stream errors carry the status a JSON answer would have had
        if error.get("type") == "server_error" or (isinstance(code, int) and code >= 500):
            return line[:500]
    return None


class Sender:
    """Sends cases on a thread pool (at most `workers` in flight, a few more queued) and tallies them."""

    def __init__(self, base_url: str, api_key: str, workers: int, report: FuzzReport):
        self.base_url, self.report = base_url, report
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="fuzz")
        self.slots = threading.BoundedSemaphore(2 * workers)  # Hypothesis waits here, not a long queue
        self.lock = threading.Lock()

    def submit(self, case: Case, fill_missing: bool) -> None:
        self.slots.acquire()
        future = self.pool.submit(self.send, make_cheap(case, fill_missing))
        future.add_done_callback(lambda _: self.slots.release())

    def send(self, case: Case) -> None:
        try:
            response = case.call(base_url=self.base_url, headers=self.headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            with self.lock:
                self.report.cases += 1
                self.report.operations[case.operation.label] += 1
                self.report.no_answer.append({"request": describe(case), "error": repr(exc)[:500]})
            return
        streamed_error = stream_server_error(response) if response.status_code < 500 else None
        with self.lock:
            self.report.cases += 1
            self.report.operations[case.operation.label] += 1
            self.report.statuses[response.status_code] += 1
            if response.status_code >= 500 or streamed_error:
                answer = streamed_error or response.content[:500].decode(errors="replace")
                self.report.server_errors.append(
                    {"request": describe(case), "status": response.status_code, "response": answer}
                )

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def draw_fuzzing_cases(
    operation: APIOperation, mode: GenerationMode, count: int, seed: int, sink: Callable[[Case], None]
) -> None:
    """Hypothesis draws up to `count` cases of `operation` in `mode`; each goes to `sink` at once.
    Generation only: nothing fails inside Hypothesis (failures are counted, not raised), so there is
    nothing to shrink or replay, and no example database to write."""

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=count,
        phases=[Phase.generate],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def draw(case: Case) -> None:
        sink(case)

    try:
        draw()
    except Unsatisfiable:
        pass  # a negative body for an operation that takes no input at all: nothing to draw


def run_fuzz(
    base_url: str, api_key: str, cases: int, seed: int = 0, workers: int = 8, deadline_s: float = DEADLINE_S
) -> FuzzReport:
    """About `cases` schemathesis cases (all of the coverage phase, the rest fuzzing) against the server's
    own OpenAPI schema; nothing new is sent after `deadline_s`."""
    schema: BaseSchema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    report = FuzzReport(seed=seed)
    start = time.monotonic()
    sender = Sender(base_url, api_key, workers, report)

    def sink(case: Case, phase: str) -> None:
        if time.monotonic() - start > deadline_s:
            return  # out of time: Hypothesis finishes its (bounded) draws without sending them
        setattr(report, phase, getattr(report, phase) + 1)
        sender.submit(case, fill_missing=phase == "fuzzing_cases")

    try:
        for operation in operations:
            config = schema.config.generation_for(operation=operation, phase="coverage")
            coverage = schema.iter_coverage_cases(
                operation, generation_modes=list(GenerationMode), generation_config=config
            )
            for case in coverage:
                sink(case, "coverage_cases")
        # Operations without a body have next to nothing to draw (Hypothesis stops after one case); the
        # rest of the budget is shared by the operations with a body, positive and negative alike.
        with_body = [op for op in operations if len(op.body) > 0]
        per_draw = math.ceil(max(cases - report.coverage_cases, 0) / max(2 * len(with_body), 1))
        for operation in operations:
            count = per_draw if operation in with_body else 1
            for mode in GenerationMode:
                draw_fuzzing_cases(operation, mode, count, seed, lambda case: sink(case, "fuzzing_cases"))
    finally:
        sender.close()
        report.seconds = time.monotonic() - start
    return report


@pytest.fixture(scope="module")
def fuzz_server(model_dir):
    with LiveServer(*SERVER_ARGS) as s:
        yield s


@pytest.mark.model
def test_no_generated_request_gets_a_server_error_or_leaks(fuzz_server):
    report = run_fuzz(fuzz_server.url, API_KEY, REQUESTED_CASES)
    summary = report.brief()

    # The server is whole first: a test failing on a 5xx below still shows that much.
    headers = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200, summary
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    r = httpx.post(fuzz_server.url + "/v1/completions", headers=headers, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    m = fuzz_server.wait_idle()
    assert m["llmopt:num_requests_running"] == 0 and m["llmopt:num_requests_waiting"] == 0, m
    assert m["llmopt:kv_blocks_used"] == 0, m

    assert report.cases >= MIN_CASES, summary
    assert report.status_classes().get("2xx", 0) > 0, summary  # valid requests got through, too
    assert report.no_answer == [], summary
    assert report.server_errors == [], summary
