"""A `[[serve]]` entry of a recipe: one local server config, and the command its engine is started with
(llmopt.engine_servers translates the flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmopt.bench.bench_error import BenchError
from llmopt.bench.redact import is_api_key_arg, redact_args
from llmopt.engine_servers.command import EngineCommand
from llmopt.engine_servers.engine_error import EngineError
from llmopt.engine_servers.options import ServeOptions
from llmopt.engine_servers.serve_engine import engine_command


@dataclass
class ServerSpec:
    """A local server config: a name, its `llmopt serve` flags ({"max-num-seqs": 16, ...}) and the engine
    that serves them, llmopt's own as one of llmopt.engine_servers (each translates the flags)."""

    name: str
    model: str | None = None
    args: dict = field(default_factory=dict)
    # `quantize = {method = "gptq", ...}`: served from a checkpoint `llmopt quantize` makes of `model`
    # (quantized_serve.py); None: `model` as it is.
    quantize: dict | None = None
    # `engine = "vllm"` or `"llama.cpp"`: the same args, translated to that engine (llmopt.engine_servers).
    engine: str = "llmopt"

    @property
    def api_key(self) -> str | None:
        """The `api-key` of `args`, which the bench sends; the server gets it in its environment
        (engines translate it there), not on its command line, which every user of the machine can read."""
        keys = [value for key, value in self.args.items() if is_api_key_arg(key)]
        return str(keys[-1]) if keys else None

    def recorded_args(self) -> dict:
        """`args` as a run folder keeps them: without the API key."""
        return redact_args(self.args)

    def command(self, port: int) -> list[str]:
        return self.engine_command(port).argv

    def env(self) -> dict[str, str]:
        """The server's environment, with its API key (never on its command line)."""
        return self.engine_command(0).environment()

    def engine_command(self, port: int, installed: bool = True) -> EngineCommand:
        """The engine's command for these args (`installed`: with a Python that has the engine)."""
        try:
            options = ServeOptions.from_args(self.model, self.args, port)
            return engine_command(self.engine, options, check=installed)
        except EngineError as exc:
            raise BenchError(f"[[serve]] {self.name} (engine {self.engine}): {exc}") from None

    def check_engine(self, installed: bool = False) -> None:
        """That the engine takes every arg (validate: an unknown one is named before anything starts), and
        that it is installed (before a run starts its first server: a recipe stays valid on a machine
        without the peer)."""
        self.engine_command(0, installed)
