"""A point's machine-cost fields from its runs' readings: CPU seconds per 1,000 output tokens, the cores
they imply, joules per output token; None with the reason as soon as one run could not read a figure."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from llmopt.bench.measure.token_cost import NOT_MEASURED, decode_read_fields, token_cost_fields
from llmopt.bench.observe import machine_meter as meters
from llmopt.bench.observe.machine_meter import PROCESS_CPU, MachineUse
from llmopt.bench.observe.rapl import find_zones
from llmopt.bench.rundir import RunDir
from llmopt.bench.servers import server_lifecycle
from llmopt.bench.sweep import sweep
from llmopt.bench.sweep.bench_config import BenchConfig, ServerSpec
from llmopt.checkpoints import load_tokenizer
from tests.bench.observe.test_rapl import set_uj, zone


def use(wall: float, cpu: float | None, joules: float | None) -> MachineUse:
    cpu_source = "process tree (psutil)" if cpu is not None else "the server's process could not be read"
    energy_source = "rapl" if joules is not None else "no /sys/class/powercap"
    return MachineUse(wall, cpu, cpu_source, joules, energy_source, ["package-0"] if joules else None)


def test_two_runs_pooled():
    fields = token_cost_fields([use(2.0, 3.0, 40.0), use(2.0, 5.0, 60.0)], output_tokens=4000)
    assert fields["server_cpu_s"] == 8.0 and fields["server_cores"] == pytest.approx(2.0)  # 8 s in 4 s
    assert (
        fields["cpu_s_per_1k_tokens"] == pytest.approx(2.0)
        and fields["cpu_source"] == "process tree (psutil)"
    )
    assert fields["energy_j"] == 100.0 and fields["joules_per_token"] == pytest.approx(0.025)
    assert fields["energy_source"] == "rapl" and fields["energy_domains"] == ["package-0"]


def test_a_run_without_a_figure_makes_it_none_with_its_reason():
    fields = token_cost_fields([use(2.0, 3.0, 40.0), use(2.0, None, None)], output_tokens=4000)
    assert fields["server_cpu_s"] is None and fields["cpu_s_per_1k_tokens"] is None
    assert fields["server_cores"] is None and fields["cpu_source"] == "the server's process could not be read"
    assert fields["joules_per_token"] is None and fields["energy_source"] == "no /sys/class/powercap"
    assert fields["energy_domains"] is None


def test_no_tokens_or_no_reading():
    assert token_cost_fields([use(1.0, 2.0, 3.0)], output_tokens=0)["cpu_s_per_1k_tokens"] is None
    old = token_cost_fields([None], output_tokens=100)  # a round written before the bench read the machine
    assert old["server_cpu_s"] is None and old["cpu_source"] == old["energy_source"] == NOT_MEASURED


@pytest.mark.slow
def test_every_point_gets_them_in_its_summary_and_csv(openai_endpoint, tokenizer_dir, tmp_path, monkeypatch):
    """A sweep against a stub whose /metrics CPU counter moves 0.5 s at every scrape, on a machine whose
    fake RAPL counter moves 1 J at every scrape: with the sampler off, the meter's two scrapes a run, the
    energy read after the first as the CPU counter is: each run's window holds one scrape's growth of both."""
    package = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    monkeypatch.setattr(meters, "find_zones", lambda: find_zones(tmp_path))
    scrapes = []

    def page() -> str:
        scrapes.append(1)
        set_uj(package, 1_000_000 * len(scrapes))
        return f"process_cpu_seconds_total {0.5 * len(scrapes)}\n"

    openai_endpoint.metrics = page
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        prompt_lens=[8],
        output_lens=[5],
        concurrencies=[2],
        num_requests=4,
        num_runs=2,
        warmup=1,
        metrics_interval=0,
    )
    [point] = sweep.run_sweep(config, tmp_path / "r", False, load_tokenizer(tokenizer_dir))
    assert point.output_tokens == 2 * 4 * 5 and point.cpu_source == PROCESS_CPU
    assert point.server_cpu_s == pytest.approx(2 * 0.5)  # each run: one scrape's growth
    assert point.cpu_s_per_1k_tokens == pytest.approx(1.0 / 40 * 1000)
    assert point.energy_source == "rapl" and point.energy_j == pytest.approx(2 * 1.0)
    assert point.joules_per_token == pytest.approx(2.0 / 40)
    assert 0 < point.server_cores == pytest.approx(point.server_cpu_s / point.duration_s, rel=0.5)
    [row] = list(csv.DictReader(RunDir(tmp_path / "r").summary_csv.read_text().splitlines()))
    assert float(row["joules_per_token"]) == pytest.approx(0.05) and row["energy_source"] == "rapl"
    assert float(row["cpu_s_per_1k_tokens"]) == pytest.approx(25.0) and row["cpu_source"] == PROCESS_CPU


class StartedHere:
    """In place of LocalServer: serves through the scripted endpoint, its process this test's own."""

    url = ""  # the scripted endpoint's, set by the test
    pid = os.getpid()

    def __init__(self, command, ready_timeout_s: float, log_path: Path, env: dict | None = None):
        pass

    def wait_ready(self) -> StartedHere:
        return self

    def stop(self) -> int:
        return 0


@pytest.mark.slow
def test_a_started_servers_cpu_comes_from_its_process_tree_round_after_round(
    openai_endpoint, tokenizer_dir, tmp_path, monkeypatch
):
    """Two rounds (each kept in rounds.jsonl, the point summarized from them): the process tree's CPU
    seconds of each round's run, pooled."""
    monkeypatch.setattr(server_lifecycle, "LocalServer", StartedHere)
    monkeypatch.setattr(StartedHere, "url", openai_endpoint.url.removesuffix("/v1"))
    config = BenchConfig.from_settings(
        servers=[ServerSpec("here")],
        model="scripted",
        prompt_lens=[8],
        output_lens=[3],
        concurrencies=[1],
        num_requests=2,
        warmup=0,
        rounds=2,
    )
    [point] = sweep.run_sweep(config, tmp_path / "r", False, load_tokenizer(tokenizer_dir))
    assert point.cpu_source.startswith("process tree (") and point.server_cpu_s >= 0  # 10 ms ticks
    assert point.cpu_s_per_1k_tokens == pytest.approx(point.server_cpu_s / 12 * 1000)
    rounds = RunDir(tmp_path / "r").read_rounds()
    cpu = [run["result"]["machine"]["cpu_s"] for entry in rounds for run in entry["runs"]]
    assert len(cpu) == 2 and sum(cpu) == pytest.approx(point.server_cpu_s)


def test_the_decode_reads_are_a_steps_bytes_over_the_itl_beside_the_machines_bandwidth():
    read = MachineUse(1.0, None, "-", None, "-", None, decode_weight_bytes=108e6, machine_read_gbs=30.0)
    fields = decode_read_fields([read, read], itl_median_ms=10.0)
    assert fields["decode_weight_bytes"] == 108e6 and fields["machine_read_gbs"] == 30.0
    assert fields["decode_read_gbs"] == pytest.approx(10.8) and fields["decode_read_share"] == pytest.approx(
        0.36
    )
    unsaid = decode_read_fields([MachineUse(1.0, None, "-", None, "-"), None], itl_median_ms=10.0)
    assert set(unsaid.values()) == {None}  # a server that does not say its bytes: no figure, no guess
    assert decode_read_fields([read], itl_median_ms=None)["decode_read_gbs"] is None  # nothing streamed
