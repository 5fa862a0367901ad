"""`llmopt serve`: load the engine, then run the API under uvicorn until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import sys

import uvicorn

from llmopt.checkpoints import DEFAULT_MODEL
from llmopt.engine.config import EngineConfig
from llmopt.engine.llm_engine import LLMEngine
from llmopt.server.app import create_app
from llmopt.server.settings import ServerSettings

log = logging.getLogger("llmopt.serve")


class Server(uvicorn.Server):
    """uvicorn, plus: say where we listen once ready, and end running requests at once on a signal
    (each stream gets an error chunk) instead of waiting for them to finish."""

    def __init__(self, config: uvicorn.Config, app, model_name: str, api_key: str | None):
        super().__init__(config)
        self.app = app
        self.model_name = model_name
        self.api_key = api_key

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        host, port = self.config.host, self.config.port
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}"
        auth = f' -H "Authorization: Bearer {self.api_key}"' if self.api_key else ""
        print(f"llmopt serving {self.model_name} at {url}/v1", flush=True)
        print(
            f"try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f'-d \'{{"model": "{self.model_name}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
            flush=True,
        )

    def handle_exit(self, sig, frame) -> None:
        self.app.state.engine_thread.shutdown(timeout=0)
        super().handle_exit(sig, frame)


def serve(
    config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue_len: int | None = None,
) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    engine = LLMEngine(config)
    name = served_model_name or (config.model or DEFAULT_MODEL)
    app = create_app(engine, ServerSettings(name, api_key, max_queue_len))
    uvicorn_config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    Server(uvicorn_config, app, name, api_key).run()
