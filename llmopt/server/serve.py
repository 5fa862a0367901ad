"""`llmopt serve`: load the engine, then run the API under uvicorn until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import uvicorn

from llmopt.engine.config import EngineConfig
from llmopt.engine.engine_thread import EngineThread
from llmopt.engine.llm_engine import LLMEngine
from llmopt.server.settings import ServerSettings

log = logging.getLogger("llmopt.serve")


class Server(uvicorn.Server):
    """uvicorn, plus: say where we listen once ready, and end running requests at once on a signal
    (each stream gets an error chunk) instead of waiting for them to finish."""

    def __init__(self, config: uvicorn.Config, app, settings: ServerSettings):
        super().__init__(config)
        self.app = app
        self.model_name = settings.served_model_name
        self.api_key = settings.api_key  # never printed: logs end up in files (bench run folders, CI output)
        self.api_key_env = settings.api_key_env

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        host, port = self.config.host, self.config.port
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}"
        key = f"${self.api_key_env}" if self.api_key_env else "KEY"
        auth = f' -H "Authorization: Bearer {key}"' if self.api_key else ""
        print(f"llmopt serving {self.model_name} at {url}/v1", flush=True)
        if self.api_key:
            print(f"/v1 needs the API key (the one ending in {self.api_key[-4:]!r})", flush=True)
        print(
            f"try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f'-d \'{{"model": "{self.model_name}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
            flush=True,
        )

    def handle_exit(self, sig, frame) -> None:
        self.app.state.engine_thread.shutdown(timeout=0)
        super().handle_exit(sig, frame)


@dataclass(frozen=True)
class Listener:
    """Where uvicorn listens and how many connections it holds: beyond `limit_concurrency` open
    connections new ones get 503, and idle keep-alive connections close after `timeout_keep_alive` s, so
    slow or idle clients cannot hold every socket. The values come from the serve options."""

    host: str
    port: int
    limit_concurrency: int | None
    timeout_keep_alive: float


def load_engine(config: EngineConfig) -> LLMEngine:
    """The engine, loaded on a thread that then exits. libgomp keeps an OpenMP pool for every thread that
    ran a parallel region: loading on the main thread left its pool beside the engine thread's, 4 OpenMP
    threads on 2 cores, so libgomp throttled its spin-wait and every parallel region of a step waited on
    a worker's wake-up (served 4-bit ITL 18-28 ms against an 8.6 ms in-process step). A thread's pool ends
    with the thread, so only the engine thread's is left."""
    with ThreadPoolExecutor(1, thread_name_prefix="llmopt-load") as loader:
        return loader.submit(LLMEngine, config).result()


def serve(config: EngineConfig, settings: ServerSettings, listener: Listener) -> None:
    engine = load_engine(config)
    print(engine.runner.startup_line, flush=True)
    engine_thread = EngineThread(engine)
    # The engine's warm-up (0.2 s of compiled kernels, which release the GIL) runs while the API's
    # modules are imported here, not with this module (FastAPI, the routes: 0.15 s), and uvicorn starts
    # (0.17 s): a warm start was healthy 0.2 s sooner so.
    engine_thread.begin()
    from llmopt.server.app import create_app

    app = create_app(engine_thread, settings)
    uvicorn_config = uvicorn.Config(
        app,
        host=listener.host,
        port=listener.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        limit_concurrency=listener.limit_concurrency,
        timeout_keep_alive=listener.timeout_keep_alive,
    )
    Server(uvicorn_config, app, settings).run()
