"""The server a sweep sends a matrix to: the endpoint it was given, or a local server config
(`[[serve]]`) started here through launcher.py for its points and stopped after them, also when they
fail or are interrupted; and the model to ask for when --model is not given."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx

from llmopt.bench.auth import bearer_header
from llmopt.bench.bench_error import BenchError
from llmopt.bench.load.client import Target
from llmopt.bench.servers.launcher import LocalServer
from llmopt.bench.settings import LoadSettings, TargetSettings

if TYPE_CHECKING:
    from llmopt.bench.rundir import RunDir
    from llmopt.bench.servers.server_spec import ServerSpec

READY_TIMEOUT_S = 600  # a local server's first start may load (or convert) its model


@contextlib.contextmanager
def serving(
    config: TargetSettings, load: LoadSettings, run: RunDir, server_name: str, spec: ServerSpec | None
) -> Iterator[Target]:
    """The target to send to (the [target] settings, with the [load] table's timeout and connection
    reuse): the endpoint, or a local server started here (and stopped after); a local server's output
    goes to the run folder's log of `server_name`."""
    server = None
    if spec is not None:
        log = run.server_log(server_name)
        server = LocalServer(spec.command, ready_timeout_s=READY_TIMEOUT_S, log_path=log, env=spec.env())
    # A local server's own key, if its args give one, else ours (sent to a server that may ignore it).
    api_key = (spec.api_key if spec else None) or config.api_key
    try:
        if server is not None:
            server.wait_ready()
        endpoint = server.url + "/v1" if server else config.endpoint
        model = config.model or first_model(endpoint, api_key)
        yield Target(
            endpoint,
            model,
            config.api,
            api_key,
            config.ignore_eos,
            load.request_timeout,
            load.connection_reuse,
            server_pid=server.pid if server is not None else None,
        )
    finally:
        if server is not None:
            server.stop()


def first_model(endpoint: str, api_key: str | None) -> str:
    """The first model that `endpoint`/models lists: what to ask for when --model is not given."""
    try:
        r = httpx.get(endpoint.rstrip("/") + "/models", headers=bearer_header(api_key), timeout=30)
        r.raise_for_status()
        body = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BenchError(f"cannot list models at {endpoint}/models ({exc}); pass --model") from None
    models = body.get("data") or body.get("models") or []
    if not models:
        raise BenchError(f"{endpoint}/models lists no model; pass --model")
    return models[0].get("id") or models[0].get("name")
