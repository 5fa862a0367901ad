"""The bench's face: what a script needs to run a bench, send a load of its own, or read a run, by name,
without knowing which wing holds it (`from llmopt.bench import LocalServer, run_point, Target`).

Each name is loaded on first use (PEP 562's module `__getattr__`): the report imports `rundir.py`
through this package, and it must not pay for the client, the sweep and the other engines' commands."""

from __future__ import annotations

import importlib

# name -> the module that holds it
FACE = {
    # run a bench and read a run
    "BenchConfig": "llmopt.bench.sweep.bench_config",
    "BenchError": "llmopt.bench.bench_error",
    "ServerSpec": "llmopt.bench.servers.server_spec",
    "load_recipe": "llmopt.bench.sweep.recipe",
    "run_sweep": "llmopt.bench.sweep.sweep",
    "RunDir": "llmopt.bench.rundir",
    "PointSummary": "llmopt.bench.schema",
    "RunSettings": "llmopt.bench.schema",
    # local servers
    "LocalServer": "llmopt.bench.servers.launcher",
    "free_port": "llmopt.bench.servers.launcher",
    "llmopt_server": "llmopt.bench.servers.launcher",
    # a load of one's own: requests, the load point and its runner, the client
    "BenchRequest": "llmopt.bench.workload.bench_request",
    "Conversation": "llmopt.bench.workload.conversation",
    "ToolCall": "llmopt.bench.workload.conversation",
    "Turn": "llmopt.bench.workload.conversation",
    "agent_conversations": "llmopt.bench.workload.agent",
    "AGENT_SYSTEM_HEADER": "llmopt.bench.workload.agent",
    "AGENT_TOOLS": "llmopt.bench.workload.agent",
    "corpus_token_ids": "llmopt.bench.workload.text",
    "count_tokens": "llmopt.bench.workload.text",
    "text_of_length": "llmopt.bench.workload.text",
    "LoadPoint": "llmopt.bench.load.load_point",
    "RequestRecord": "llmopt.bench.schema",
    "Target": "llmopt.bench.load.client",
    "send": "llmopt.bench.load.client",
    "client_session": "llmopt.bench.load.loops",
    "run_point": "llmopt.bench.load.runner",
    "run_sessions": "llmopt.bench.load.runner",
    "client_summary": "llmopt.bench.load.self_check",
    # figures and readings
    "summarize": "llmopt.bench.measure.request_metrics",
    "parse_metrics": "llmopt.bench.observe.server_stats",
    "read_bandwidth_gbs": "llmopt.bench.observe.memory_bandwidth",
}
# Names the face gives another name than its module does (the agent workload's constants would read as
# the bench's own).
RENAMED = {"AGENT_SYSTEM_HEADER": "SYSTEM_HEADER", "AGENT_TOOLS": "TOOLS"}

__all__ = sorted(FACE)


def __getattr__(name: str) -> object:
    if name not in FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(FACE[name]), RENAMED.get(name, name))
