"""An agent loop against one `llmopt serve` on the default model, through the official `openai` client:
each session is --turns turns with three tools (get_weather, search, calculator; JSON-schema
parameters). Every turn replays the whole history and asks with `tools` and a `tool_choice`: "required"
on turns 1..N-1 (a named function, calculator, on the middle turn) and "auto" on the last. Each returned
call is checked: its name is a declared tool (the named one when named), its id is present and unique in
the conversation, its arguments parse as JSON and validate with `jsonschema` against that tool's
parameters, and the turn's finish_reason is "tool_calls". The call and a synthetic tool result are then
appended for the next turn. Sessions run in both modes, JSON body and streamed (the calls rebuilt from
the deltas as openai SDK users do), one after the other, each session with a city and topic of its own,
so that sessions share only the system prompt and the tool definitions in the cache. Greedy.
Writes results/tool_calls.json.

    .venv/bin/python benchmarks/tool_calls.py [--sessions 3] [--turns 10]

Target: tool calls valid 100 %.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from dataclasses import asdict, dataclass, field

import jsonschema
from harness import MachineLoad, rotated, tail_latency
from openai import OpenAI
from rich.console import Console
from rich.table import Table

from llmopt.bench import llmopt_server
from llmopt.engine_servers.llmopt import llmopt_environment
from results import write_result

MODES = ("json", "stream")
SERVED_NAME = "agent"
# Bounded strings and numbers, so that a greedy call always closes within --max-tokens.
TOOL_PARAMETERS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "search": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 48},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "calculator": {
        "type": "object",
        "properties": {"expression": {"type": "string", "minLength": 1, "maxLength": 32}},
        "required": ["expression"],
        "additionalProperties": False,
    },
}
DESCRIPTIONS = {
    "get_weather": "The current weather in a city.",
    "search": "Search the web; returns the titles of the best pages.",
    "calculator": "Evaluate an arithmetic expression.",
}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": p}}
    for n, p in TOOL_PARAMETERS.items()
]
NAMED_TOOL = "calculator"
SYSTEM = (
    "You are a travel assistant. Use the tools to answer: check the weather, search for what the user "
    "asks about, and do arithmetic with the calculator. Call one tool at a time."
)
CITIES = [
    "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Dublin", "Nairobi", "Lisbon",
    "Seoul", "Austin", "Krakow", "Perth", "Bogota", "Zurich", "Accra", "Havana", "Manila", "Tunis",
]  # fmt: skip
TOPICS = [
    "museums", "street food", "hiking trails", "jazz clubs", "train passes", "night markets",
    "bike rentals", "old bookshops", "beaches", "football matches", "botanical gardens", "ferries",
]  # fmt: skip


@dataclass
class Turn:
    """One request of a session and what checking its answer found."""

    mode: str
    session: int
    turn: int
    tool_choice: str
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    calls: int
    valid_calls: int
    content: str | None
    problems: list[str] = field(default_factory=list)


def tool_choice_of(turn: int, turns: int) -> str | dict:
    """ "required" but on the last turn ("auto"), and the named function on the middle turn."""
    if turn == turns:
        return "auto"
    if turns >= 3 and turn == (turns + 1) // 2:
        return {"type": "function", "function": {"name": NAMED_TOOL}}
    return "required"


def first_message(session: int) -> str:
    """A question of its own for each session (city and topic), so no session warms another's cache
    past the shared system prompt and tools."""
    city = CITIES[session % len(CITIES)]
    topic = TOPICS[(session * 7 + session // len(CITIES)) % len(TOPICS)]
    return (
        f"I am going to {city} next week for {session % 5 + 3} days. What is the weather there, which "
        f"{topic} are worth a visit, and how much is {session % 5 + 3} nights at 85 dollars a night?"
    )


def tool_result(name: str, arguments: str) -> str:
    """A made-up result, the same for the same call (a hash picks the numbers)."""
    seed = zlib.crc32(f"{name}:{arguments}".encode())
    if name == "get_weather":
        return json.dumps({"temperature": seed % 30, "sky": ["clear", "cloudy", "rain"][seed % 3]})
    if name == "search":
        return json.dumps({"results": [f"Top {k} pick #{seed % 97}" for k in ("first", "second")]})
    return json.dumps({"result": seed % 1000})


def ask(client: OpenAI, mode: str, request: dict) -> tuple[str | None, list[dict], str | None, dict]:
    """(content, calls as {"id", "name", "arguments"}, finish reason, usage) of choice 0: read off the
    JSON body, or put together from a stream's deltas by each call's index."""
    if mode == "json":
        response = client.chat.completions.create(**request)
        choice = response.choices[0]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in choice.message.tool_calls or []
        ]
        return choice.message.content, calls, choice.finish_reason, response.usage.model_dump()
    content, by_index, finish, usage = "", {}, None, {}
    stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = by_index.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return content or None, [by_index[i] for i in sorted(by_index)], finish, usage


def call_problems(call: dict, named: str | None, seen_ids: set[str]) -> list[str]:
    """What is wrong with one call (nothing: a valid call)."""
    name = call["name"]
    if name not in TOOL_PARAMETERS:
        return [f"unknown tool {name!r}"]
    if named is not None and name != named:
        return [f"called {name!r}, not the named {named!r}"]
    problems = []
    if not call["id"]:
        problems.append("no id")
    elif call["id"] in seen_ids:
        problems.append(f"id {call['id']!r} used before")
    try:
        jsonschema.validate(json.loads(call["arguments"]), TOOL_PARAMETERS[name])
    except json.JSONDecodeError as exc:
        problems.append(f"{name} arguments are not JSON ({exc.msg}): {call['arguments'][:80]!r}")
    except jsonschema.ValidationError as exc:
        problems.append(f"{name} arguments break the schema: {exc.message[:120]}")
    return problems


def run_turn(client: OpenAI, mode: str, session: int, turn: int, args, messages: list, seen: set) -> Turn:
    choice = tool_choice_of(turn, args.turns)
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    request = {
        "model": SERVED_NAME,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": choice,
        "parallel_tool_calls": args.parallel,
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    start = time.perf_counter()
    content, calls, finish, usage = ask(client, mode, request)
    latency = time.perf_counter() - start
    problems: list[str] = []
    valid = 0
    for call in calls:
        found = call_problems(call, named, seen)
        problems += found
        valid += not found
        seen.add(call["id"])
    if choice != "auto" and not calls:
        problems.append(f"tool_choice {choice if named is None else named!r} but no tool call")
    if calls and finish != "tool_calls":
        problems.append(f"finish_reason {finish!r} with tool calls")
    details = usage.get("prompt_tokens_details") or {}
    record = Turn(
        mode=mode,
        session=session,
        turn=turn,
        tool_choice=named or choice,
        latency_s=latency,
        prompt_tokens=usage.get("prompt_tokens", 0),
        cached_tokens=details.get("cached_tokens") or 0,
        completion_tokens=usage.get("completion_tokens", 0),
        finish_reason=finish,
        calls=len(calls),
        valid_calls=valid,
        content=content,
        problems=problems,
    )
    replayed = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls
    ]
    messages.append({"role": "assistant", "content": content, **({"tool_calls": replayed} if calls else {})})
    messages += [
        {"role": "tool", "tool_call_id": c["id"], "content": tool_result(c["name"], c["arguments"])}
        for c in calls
    ]
    return record


def run_session(client: OpenAI, mode: str, session: int, args, console: Console) -> list[Turn]:
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": first_message(session)},
    ]
    seen: set[str] = set()
    turns = []
    for turn in range(1, args.turns + 1):
        record = run_turn(client, mode, session, turn, args, messages, seen)
        turns.append(record)
        mark = "ok" if not record.problems else "; ".join(record.problems)
        console.print(
            f"{mode} session {session} turn {turn} ({record.tool_choice}): {record.calls} call(s), "
            f"{record.latency_s * 1000:.0f} ms, prompt {record.prompt_tokens} (cached "
            f"{record.cached_tokens}): {mark}",
            highlight=False,
        )
        if record.finish_reason == "length":
            console.print("[yellow]the answer was cut at --max-tokens[/yellow]")
    return turns


def warm_up(client: OpenAI, args) -> None:
    """Compile the tool grammars (required, then named) and build the grammar compiler's vocabulary
    once, on a question no session asks, so that no session's first turn times them."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Warm up: 2 + 2?"}]
    for choice in ("required", {"type": "function", "function": {"name": NAMED_TOOL}}):
        client.chat.completions.create(
            model=SERVED_NAME,
            messages=messages,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=args.parallel,
            max_tokens=args.max_tokens,
            temperature=0,
        )


def summary(turns: list[Turn], sessions: int) -> dict:
    calls = sum(t.calls for t in turns)
    valid = sum(t.valid_calls for t in turns)
    required = [t for t in turns if t.tool_choice != "auto"]
    last = [t for t in turns if t.turn == max(x.turn for x in turns)]
    latencies = [t.latency_s for t in turns]
    return {
        "sessions": sessions,
        "turns": len(turns),
        "tool_calls": calls,
        "valid_calls": valid,
        "valid_pct": 100 * valid / calls if calls else None,
        "turns_with_problems": sum(bool(t.problems) for t in turns),
        "required_turns_without_call": sum(t.calls == 0 for t in required),
        "auto_turns_with_calls": sum(t.calls > 0 for t in turns if t.tool_choice == "auto"),
        "mean_turn_ms": 1000 * sum(latencies) / len(latencies),
        "tail_turn": tail_latency(latencies),
        "last_turn_prompt_tokens": sum(t.prompt_tokens for t in last) / len(last),
        "last_turn_cached_tokens": sum(t.cached_tokens for t in last) / len(last),
    }


def render(summaries: dict[str, dict], load: MachineLoad, args) -> Table:
    table = Table(
        title=load.title(
            f"agent loop: {args.sessions} sessions x {args.turns} turns per mode, 3 tools, greedy, "
            "history replayed each turn (last turn: means over sessions)"
        )
    )
    columns = ("mode", "turns", "tool calls", "valid", "mean turn", "tail turn", "last prompt", "last cached")
    for col in columns:
        table.add_column(col, justify="right")
    for mode, s in summaries.items():
        tail = s["tail_turn"]
        table.add_row(
            mode,
            str(s["turns"]),
            str(s["tool_calls"]),
            "-" if s["valid_pct"] is None else f"{s['valid_pct']:.1f} %",
            f"{s['mean_turn_ms']:,.0f} ms",
            f"{tail['stat']} {tail['ms']:,.0f} ms",
            f"{s['last_turn_prompt_tokens']:,.0f}",
            f"{s['last_turn_cached_tokens']:,.0f}",
        )
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=3, help="sessions per mode")
    ap.add_argument("--turns", type=int, default=10, help="turns per session")
    ap.add_argument("--max-tokens", type=int, default=96, help="max_tokens of every turn")
    ap.add_argument("--parallel", action="store_true", help="parallel_tool_calls true (default false)")
    args = ap.parse_args()
    if args.sessions < 1 or args.turns < 1:
        ap.error("--sessions and --turns must be at least 1")
    console = Console(width=150)
    load = MachineLoad.begin(console)
    serve_args = ["--served-model-name", SERVED_NAME]
    server = llmopt_server(serve_args, env=llmopt_environment(None))
    turns: list[Turn] = []
    with server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        warm_up(client, args)
        # Sessions alternate modes (which first changes each round); session numbers never repeat, so
        # every session starts from a question of its own.
        for round_index in range(args.sessions):
            for mode in rotated(list(MODES), round_index):
                session = round_index * len(MODES) + MODES.index(mode)
                turns += run_session(client, mode, session, args, console)
    summaries = {mode: summary([t for t in turns if t.mode == mode], args.sessions) for mode in MODES}
    table = render(summaries, load, args)
    console.print(table)
    for mode, s in summaries.items():
        met = s["valid_pct"] == 100 and s["required_turns_without_call"] == 0
        verdict = "[green]met[/green]" if met else "[bold red]NOT met[/bold red]"
        console.print(f"{mode}: tool calls valid {s['valid_pct']} % (target 100 %): {verdict}")
    path = write_result(
        "tool_calls",
        {
            "args": vars(args),
            "summaries": summaries,
            "turns": [asdict(t) for t in turns],
            **load.finish(console),
        },
        [table],
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
