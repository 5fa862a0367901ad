"""A load point of a multi-turn workload: sessions, not requests, are the unit of load. A session sends
its turns one at a time, each after the previous answer (plus the think time), each replaying the whole
history; `sessions` run at once (a closed loop: when one ends the next starts), or sessions start at a
`session_rate` (an open loop). A failed turn ends its session (recorded), never another's.

Agent sessions send `tools`; the first refusal (HTTP 400 naming tools, as llmopt serve and most servers
without tool support answer) switches the point to tools written as text, says so in its result, and
sends the refused turn again as text: a refused request was not served, so this counts nothing twice."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from llmopt.bench.client import RequestRecord, Target, send
from llmopt.bench.conversation import Conversation
from llmopt.bench.load_point import Collector, LoadPoint
from llmopt.bench.loops import open_loop

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
    for k in range(len(conv.turns)):
        if k and shared.point.think_time:
            await asyncio.sleep(shared.point.think_time)
        if shared.ended():
            return
        record = await send_turn(shared, conv, k, answers, answer_tokens)
        record.session, record.turn = number, k
        shared.collect(record)
        if not record.success:
            return
        answers.append(record.text or "")
        answer_tokens += record.output_tokens


async def send_turn(
    shared: Sessions, conv: Conversation, k: int, answers: list[str], answer_tokens: int
) -> RequestRecord:
    """Turn `k`'s request sent and timed; with tools as text once the server refused them."""
    with_tools = bool(conv.tools) and shared.tools.send
    request = conv.request(k, answers, answer_tokens, with_tools)
    record = await send(
        shared.session, shared.target, request, next(shared.counter), shared.t0, shared.count_tokens
    )
    if with_tools and refuses_tools(record):
        if shared.tools.send:
            shared.tools.send, shared.tools.refusal = False, record.error
        request = conv.request(k, answers, answer_tokens, False)
        record = await send(
            shared.session, shared.target, request, record.index, shared.t0, shared.count_tokens
        )
    return record
