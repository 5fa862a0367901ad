"""The RAPL energy counters against fake powercap folders laid out as Linux lays them out: which zones are
summed, a counter that wraps between start and stop, and folders that cannot be read (with the reason
the summary gives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.bench.observe.rapl import RaplMeter, find_zones, grown_uj

MAX_UJ = 262_143_328_850  # an Intel package's max_energy_range_uj


def zone(root: Path, folder: str, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    path = root / folder
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def set_uj(path: Path, energy_uj: int) -> None:
    (path / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def two_sockets(tmp_path) -> dict[str, Path]:
    """Two packages with their core, uncore and DRAM zones, a platform zone, and the MMIO copy of
    package 0: only the packages and the DRAM count."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type's own folder: no zone
    return {
        "package-0": zone(root, "intel-rapl:0", "package-0", 1_000_000),
        "core": zone(root, "intel-rapl:0:0", "core", 500_000),
        "uncore": zone(root, "intel-rapl:0:1", "uncore", 100_000),
        "dram": zone(root, "intel-rapl:0:2", "dram", 2_000_000),
        "package-1": zone(root, "intel-rapl:1", "package-1", 3_000_000),
        "psys": zone(root, "intel-rapl:2", "psys", 9_000_000),
        "mmio": zone(root, "intel-rapl-mmio:0", "package-0", 1_000_000),
        "root": root,
    }


def test_packages_and_dram_are_summed_their_parts_and_the_platform_are_not(two_sockets):
    zones, reason = find_zones(two_sockets["root"])
    assert reason is None and sorted(z.name for z in zones) == ["dram", "package-0", "package-1"]
    meter = RaplMeter(zones)
    meter.start()
    for name, grown in (("package-0", 40), ("dram", 5), ("package-1", 30), ("core", 1000), ("psys", 1000)):
        path = two_sockets[name]
        set_uj(path, int((path / "energy_uj").read_text()) + grown * 1_000_000)
    set_uj(two_sockets["mmio"], 999_000_000)
    assert meter.stop() == pytest.approx(75.0)  # joules: 40 + 5 + 30


def test_a_counter_that_wraps_between_start_and_stop(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", MAX_UJ - 2_000_000)
    meter = RaplMeter(find_zones(tmp_path)[0])
    meter.start()
    set_uj(package, 3_000_000)  # 2 J to the top, then 3 J from 0
    assert meter.stop() == pytest.approx(5.0)
    assert grown_uj(10, 25, 100) == 15 and grown_uj(90, 5, 100) == 15


def test_an_amd_zone_is_read_the_same_way(tmp_path):
    package = zone(tmp_path, "amd-rapl:0", "package-0", 0)
    meter = RaplMeter(find_zones(tmp_path)[0])
    meter.start()
    set_uj(package, 7_500_000)
    assert meter.stop() == pytest.approx(7.5) and meter.domains == ["package-0"]


def test_no_folder_or_no_package_says_why(tmp_path):
    assert find_zones(tmp_path / "none") == ([], f"no {tmp_path / 'none'}")
    zone(tmp_path, "intel-rapl:0", "psys", 0)
    assert find_zones(tmp_path) == ([], f"no RAPL package zone in {tmp_path}")


def test_a_counter_only_root_may_read_says_permission_denied(tmp_path, monkeypatch):
    # As the kernel's 0400 energy_uj reads to anyone else (the tests may run as root, who reads it all).
    package = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == package / "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    zones, reason = find_zones(tmp_path)
    assert zones == [] and reason.startswith("permission denied") and "intel-rapl:0" in reason


def test_a_counter_that_cannot_be_read_again_gives_none(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = RaplMeter(find_zones(tmp_path)[0])
    meter.start()
    (package / "energy_uj").write_text("garbage\n")
    assert meter.stop() is None
