"""Client habits: what a client's own choices (streaming, uniform prompt lengths, smooth arrivals,
kept-alive connections, a ramp-up) change in what a server seems to do. A recipe's `[[habit]]` entries
each name one change from the baseline (the recipe's own settings); every baseline load point is then
run once more per habit with only that change, so one run holds the baseline and each habit's effect
beside it (see report/client_habits.py)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from llmopt.bench.load.load_point import LoadPoint

# {recipe key: setting name (settings.py)} of the settings a habit may change.
SETTINGS = {
    "stream": "streams",
    "prompt_len_spread": "prompt_len_spread",
    "burstiness": "burstiness",
    "ramp_up": "ramp_up",
    "connection_reuse": "connection_reuse",
}
# The habits that shape arrivals apply to rate points only: a closed loop has no arrival times.
ARRIVAL_SETTINGS = {"burstiness", "ramp_up"}
NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class Habit:
    """One change from the baseline: a name (it names the points) and {recipe key: value}."""

    name: str
    settings: dict[str, object]

    def check(self) -> None:
        """ValueError for a habit that cannot run as one change."""
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise ValueError(f"habit name {self.name!r}: use letters, digits, '-', '_', '.'")
        unknown = set(self.settings) - set(SETTINGS)
        if unknown or not self.settings:
            raise ValueError(
                f"habit {self.name!r} changes {', '.join(sorted(unknown)) or 'nothing'}: a habit sets "
                f"one or more of {', '.join(SETTINGS)}"
            )
        for key, value in self.settings.items():
            flag = key in ("stream", "connection_reuse")
            if flag != isinstance(value, bool) or not isinstance(value, (bool, int, float)):
                kind = "true or false" if flag else "a number"
                raise ValueError(f"habit {self.name!r}: {key} is {kind}")

    def fields(self) -> dict[str, object]:
        """The habit as settings by name (a habit streams or does not: one stream setting)."""
        out = {SETTINGS[key]: value for key, value in self.settings.items()}
        if "streams" in out:
            out["streams"] = [out["streams"]]
        return out

    def applies_to(self, point: LoadPoint) -> bool:
        return point.rate is not None or not ARRIVAL_SETTINGS & set(self.settings)

    def point(self, base: LoadPoint) -> LoadPoint:
        """`base` with this habit's changes to it (the others are the config's: see BenchConfig)."""
        changes: dict[str, object] = {"habit": self.name}
        if "stream" in self.settings:
            changes["stream"] = self.settings["stream"]
        if "burstiness" in self.settings:
            changes["burstiness"] = float(self.settings["burstiness"])
        if "ramp_up" in self.settings:
            changes["ramp_up_s"] = float(self.settings["ramp_up"])
        return dataclasses.replace(base, **changes)

    def changes(self, config: object, base: LoadPoint) -> dict[str, list]:
        """{recipe key: [baseline value, habit value]} against the baseline `config` (a BenchConfig) and
        its load point `base`."""
        return {
            key: [base.stream if key == "stream" else config.settings()[SETTINGS[key]], value]
            for key, value in self.settings.items()
        }
