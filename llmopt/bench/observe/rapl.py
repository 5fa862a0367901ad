"""The machine's energy counters (RAPL, read through Linux's powercap folder): microjoules each CPU
package, and where the machine has one its DRAM, has used since some moment, read at a point's start
and end. Intel's and AMD's (Zen) counters both appear as `intel-rapl:N` zones; an `amd-rapl:N` folder
is read the same way. Summed: each package zone and each DRAM zone. Left out: a package's core and
uncore zones (parts of the package's figure) and the platform (`psys`) zone, which holds the packages.

A counter wraps at its zone's max_energy_range_uj; a reading lower than the one before it has wrapped
once (a point would have to run for the better part of an hour at full power to wrap one twice). Since
2020 most kernels let only root read energy_uj: then the figure is not available, and says why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
ZONE_PREFIXES = ("intel-rapl:", "amd-rapl:")


@dataclass(frozen=True)
class Zone:
    """One counter: its folder's name (intel-rapl:0), its domain (package-0, dram) and where it wraps."""

    path: Path
    name: str
    max_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text())


def counted(name: str) -> bool:
    """Whether a zone of this domain name is summed: packages and DRAM, not their parts or the platform."""
    return name.startswith("package") or name == "dram"


def find_zones(root: Path = POWERCAP) -> tuple[list[Zone], str | None]:
    """The zones to sum under `root`, each read once to check that it can be; ([], why) where none can."""
    if not root.is_dir():
        return [], f"no {root}"
    zones = []
    for folder in sorted(root.iterdir()):
        if not folder.name.startswith(ZONE_PREFIXES) or not (folder / "energy_uj").exists():
            continue
        try:
            name = (folder / "name").read_text().strip()
            if counted(name):
                zone = Zone(folder, name, int((folder / "max_energy_range_uj").read_text()))
                zone.read_uj()
                zones.append(zone)
        except PermissionError:
            return [], f"permission denied: {folder / 'energy_uj'} (root only on this kernel)"
        except (OSError, ValueError) as exc:
            return [], f"unreadable: {folder} ({exc})"
    if not zones:
        return [], f"no RAPL package zone in {root}"
    return zones, None


def grown_uj(before: int, after: int, max_uj: int) -> int:
    """A counter's growth from `before` to `after`, across one wrap at `max_uj`."""
    return after - before if after >= before else after + max_uj - before


class RaplMeter:
    """`start()` at a point's start, `stop()` at its end: the joules used in between (summed zones)."""

    def __init__(self, zones: list[Zone]):
        self.zones = zones
        self._start: list[int] = []

    @property
    def domains(self) -> list[str]:
        return [zone.name for zone in self.zones]

    def start(self) -> None:
        self._start = [zone.read_uj() for zone in self.zones]

    def stop(self) -> float | None:
        """Joules since start(); None when a counter could not be read again."""
        try:
            now = [zone.read_uj() for zone in self.zones]
        except (OSError, ValueError):
            return None
        grown = (grown_uj(a, b, z.max_uj) for a, b, z in zip(self._start, now, self.zones))
        return sum(grown) / 1e6
