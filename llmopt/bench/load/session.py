"""A load point of a multi-turn workload: sessions, not requests, are the unit of load. A session sends
its turns one at a time, each after the previous answer (plus the think time), each replaying the whole
history; `sessions` run at once (a closed loop: when one ends the next starts), or sessions start at a
`session_rate` (an open loop). A failed turn ends its session (recorded), never another's. Through the
Responses API a session's turns are chained: each after the first names the previous answer's id
(`previous_response_id`) and sends only what is new, as the OpenAI Agents SDK does; the server keeps the
history (each turn is sent with `store`). A server that refuses chaining (llama.cpp's: HTTP 400 naming
previous_response_id) gets the whole history from then on, the refused turn sent again (it was not
served), and the records say which turns were chained.

Agent sessions send `tools`; the first refusal (HTTP 400 naming tools, as llmopt serve and most servers
without tool support answer) switches the point to tools written as text, says so in its result, and
sends the refused turn again as text: a refused request was not served, so this counts nothing twice."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from llmopt.bench.load.client import BenchRequest, Target, send
from llmopt.bench.load.load_point import Collector, LoadPoint
from llmopt.bench.load.loops import open_loop
from llmopt.bench.schema import RequestRecord
from llmopt.bench.workload.conversation import Conversation

SENT = "sent"  # a point's tools went as `tools` throughout


@dataclass
class ToolUse:
    """Whether a point's requests still send `tools`: the server's first refusal turns them off."""

    send: bool = True
    refusal: str | None = None

    def summary(self) -> str:
        if self.refusal is None:
            return SENT
        return f"refused by the server ({self.refusal}): sent as text in the messages instead"


def pooled_tools(outcomes: list[str | None]) -> str | None:
    """What became of a point's tools over its runs, or a run's workers (each one's ToolUse.summary(),
    None where it sent no tools): a refusal is what to say (the first), else SENT if any sent them, else
    None."""
    refusals = [t for t in outcomes if t not in (None, SENT)]
    if refusals:
        return refusals[0]
    return SENT if SENT in outcomes else None


def refuses_tools(record: RequestRecord) -> bool:
    return record.status == 400 and "tool" in (record.error or "").lower()


@dataclass
class Chaining:
    """Whether a point's Responses API turns still name the previous answer: the server's first refusal
    turns it off (the records' `chained` then say False)."""

    send: bool = True


def refuses_chaining(record: RequestRecord) -> bool:
    return record.status in (400, 422, 501) and "previous_response_id" in (record.error or "")


@dataclass
class Sessions:
    """What every session of one point shares."""

    session: object  # the aiohttp.ClientSession
    target: Target
    point: LoadPoint
    collect: Collector
    tools: ToolUse
    t0: float
    deadline: float | None
    count_tokens: Callable[[str], int] | None
    counter: Iterator[int]  # numbers the point's requests in the order they are sent
    chaining: Chaining = field(default_factory=Chaining)

    def ended(self) -> bool:
        return bool(self.collect.stop) or bool(self.deadline and time.perf_counter() >= self.deadline)


async def drive_sessions(
    session,
    target: Target,
    conversations: list[Conversation],
    point: LoadPoint,
    t0: float,
    collect: Collector,
    count_tokens: Callable[[str], int] | None,
    first_session: int = 0,
    take: Callable[[], int] | None = None,
    indices: list[int] | None = None,
    numbers: Iterator[int] | None = None,
) -> str | None:
    """Run the point's sessions from `t0` (a perf_counter time) on; return what became of its tools (None:
    no tools). A worker process (workers.py) runs its share: a closed loop's conversations by the numbers
    `take` gives (a counter the processes share), an open loop's the arrivals in `indices`; `numbers`
    then numbers the requests across the processes."""
    deadline = t0 + point.max_seconds if point.max_seconds else None
    tools = ToolUse(send=any(c.tools for c in conversations))
    shared = Sessions(
        session, target, point, collect, tools, t0, deadline, count_tokens, numbers or itertools.count()
    )

    async def one(i: int) -> None:
        await run_conversation(shared, conversations[i], first_session + i)

    if point.sessions is not None:
        await closed_loop(shared, len(conversations), one, take)
    else:
        await open_loop(len(conversations), point, deadline, collect.stop, t0, one, indices)
    return tools.summary() if any(c.tools for c in conversations) else None


async def closed_loop(shared: Sessions, n: int, one: Callable, take: Callable[[], int] | None = None) -> None:
    """`shared.point.sessions` sessions at once, each next one started when one ends (the next by `take`)."""
    take = take or itertools.count().__next__

    async def slot() -> None:
        while (i := take()) < n and not shared.ended():
            await one(i)

    await asyncio.gather(*(slot() for _ in range(min(shared.point.sessions, n))))


async def run_conversation(shared: Sessions, conv: Conversation, number: int) -> None:
    """One session: its turns in order, until one fails or the point ends."""
    answers: list[str] = []
    answer_tokens = 0
    previous: str | None = None  # the server's id of the last answer, for a chained session
    for k in range(len(conv.turns)):
        if k and shared.point.think_time:
            await asyncio.sleep(shared.point.think_time)
        if shared.ended():
            return
        record = await send_turn(shared, conv, k, answers, answer_tokens, previous)
        record.session, record.turn = number, k
        shared.collect(record)
        if not record.success:
            return
        answers.append(record.text or "")
        answer_tokens += record.output_tokens
        previous = record.response_id


async def send_turn(
    shared: Sessions,
    conv: Conversation,
    k: int,
    answers: list[str],
    answer_tokens: int,
    previous: str | None = None,
) -> RequestRecord:
    """Turn `k`'s request sent and timed; with tools as text once the server refused them. Through the
    Responses API it continues `previous` (turn k-1's answer) and asks the server to keep its answer."""
    responses = shared.target.api == "responses"
    chained = responses and shared.chaining.send
    previous = previous if chained and k else None
    with_tools = bool(conv.tools) and shared.tools.send
    request = turn_request(conv, k, answers, answer_tokens, with_tools, previous, chained)
    record = await send(
        shared.session, shared.target, request, next(shared.counter), shared.t0, shared.count_tokens
    )
    if previous is not None and refuses_chaining(record):
        shared.chaining.send = False
        previous, chained = None, False
        request = turn_request(conv, k, answers, answer_tokens, with_tools, previous, chained)
        record = await send(
            shared.session, shared.target, request, record.index, shared.t0, shared.count_tokens
        )
    if with_tools and refuses_tools(record):
        if shared.tools.send:
            shared.tools.send, shared.tools.refusal = False, record.error
        request = turn_request(conv, k, answers, answer_tokens, False, previous, chained)
        record = await send(
            shared.session, shared.target, request, record.index, shared.t0, shared.count_tokens
        )
    if responses and k:
        record.chained = previous is not None
    return record


def turn_request(
    conv: Conversation,
    k: int,
    answers: list[str],
    answer_tokens: int,
    tools: bool,
    previous: str | None,
    chained: bool,
) -> BenchRequest:
    request = conv.request(k, answers, answer_tokens, tools, previous)
    request.store = chained and k < len(conv.turns) - 1  # the last turn's answer is continued by none
    return request
