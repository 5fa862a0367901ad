"""A peer's command: argv, the environment variables it adds (secrets among them), and how it is shown."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

REDACTED = "***"


@dataclass
class EngineCommand:
    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to (and overriding) the caller's environment
    secret_env: set[str] = field(default_factory=set)  # names in `env` whose values are never shown
    ready_path: str = "/health"

    def environment(self) -> dict[str, str]:
        """The process's environment: ours with `env` on top, and no secret of ours it was not given (a
        stray key in our environment would lock out a bench that sends none)."""
        return {**{k: v for k, v in os.environ.items() if k not in self.secret_env}, **self.env}

    def shown(self) -> str:
        """The command as `--dry-run` prints it: `NAME=value ... argv`, secrets as ***. A key never
        travels on argv (every user of the machine can read a command line), so argv is shown whole."""
        assert not any(self.env[n] in self.argv for n in self.secret_env if n in self.env), "secret on argv"
        env = [f"{k}={REDACTED if k in self.secret_env else shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *(shlex.quote(a) for a in self.argv)])
