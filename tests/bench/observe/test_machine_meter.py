"""What a run cost the serving machine: the CPU seconds of a server process the bench started (a child
burning a known amount), a server's own process_cpu_seconds_total over HTTP, and the RAPL joules; each
figure None with its reason where it cannot be read, never a guess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmopt.bench.load.client import Target
from llmopt.bench.observe import machine_meter as meters
from llmopt.bench.observe.machine_meter import DECODE_WEIGHT_BYTES, PROCESS_CPU, machine_meter
from llmopt.bench.observe.rapl import find_zones
from tests.bench.observe.test_rapl import set_uj, zone

# A stand-in server: on each line it reads, burns that many seconds of CPU and says how much it has used.
SERVER = """
import sys, time
for line in sys.stdin:
    end = time.process_time() + float(line)
    while time.process_time() < end:
        pass
    print(time.process_time(), flush=True)
"""


def counting_page(step: float):
    """A vLLM-named /metrics page whose CPU counter grows by `step` seconds at every scrape."""
    scrapes = []

    def page() -> str:
        scrapes.append(1)
        return f"vllm:num_requests_running 1\n{PROCESS_CPU} {step * len(scrapes)}\n"

    return page


@pytest.fixture
def server_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    proc.stdin.close()
    proc.wait()


def burn(proc, seconds: float) -> float:
    proc.stdin.write(f"{seconds}\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def test_a_started_servers_cpu_seconds_from_its_process(server_process, tmp_path, monkeypatch):
    monkeypatch.setattr(meters, "find_zones", lambda: find_zones(tmp_path / "no-powercap"))
    target = Target("http://127.0.0.1:1/v1", "m", server_pid=server_process.pid)
    meter = machine_meter(target)
    start = burn(server_process, 0.01)  # started, imports done: what it used before the point
    meter.start()
    end = burn(server_process, 0.3)
    use = meter.stop()
    assert use.cpu_source.startswith("process tree (") and use.cpu_s == pytest.approx(end - start, abs=0.05)
    assert use.cpu_s / use.wall_s <= 1.1  # one busy thread: about one core
    assert use.energy_j is None and use.energy_source == f"no {tmp_path / 'no-powercap'}"


def test_the_machines_joules_over_the_run(tmp_path, monkeypatch, openai_endpoint):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    monkeypatch.setattr(meters, "find_zones", lambda: find_zones(tmp_path))
    openai_endpoint.metrics = counting_page(0.25)
    meter = machine_meter(Target(openai_endpoint.url, "m"))  # loopback: this machine's counters
    meter.start()
    set_uj(package, 17_000_000)
    use = meter.stop()
    assert (use.energy_j, use.energy_source, use.energy_domains) == (12.0, "rapl", ["package-0"])
    assert (use.cpu_s, use.cpu_source) == (0.25, PROCESS_CPU)  # the page's counter, one scrape apart


def test_without_a_counter_each_figure_says_why(openai_endpoint, server_process):
    openai_endpoint.metrics = lambda: "vllm:num_requests_running 1\n"  # no process_cpu_seconds_total
    meter = machine_meter(Target(openai_endpoint.url, "m"))
    meter.start()
    use = meter.stop()
    assert use.cpu_s is None and use.cpu_source == f"no {PROCESS_CPU} on the server's /metrics"
    assert use.energy_source == "rapl" or use.energy_source == find_zones()[1]  # this machine's answer
    remote = machine_meter(Target("http://192.0.2.7:8000/v1", "m"))  # not started: nothing is sent
    assert remote.energy is None and remote.energy_reason == "the server runs on another machine"
    gone = machine_meter(Target("http://127.0.0.1:1/v1", "m", server_pid=server_process.pid))
    gone.start()
    server_process.kill()
    server_process.wait()
    use = gone.stop()
    assert use.cpu_s is None and "could not be read" in use.cpu_source


def test_the_servers_decode_bytes_with_this_machines_bandwidth_beside_them(openai_endpoint, monkeypatch):
    monkeypatch.setattr(meters, "read_bandwidth_gbs", lambda: 30.0)  # measured once per process
    openai_endpoint.metrics = lambda: f"{PROCESS_CPU} 1\n{DECODE_WEIGHT_BYTES} 108471552\n"
    meter = machine_meter(Target(openai_endpoint.url, "m"))  # loopback: this machine's bandwidth
    meter.start()
    use = meter.stop()
    assert (use.decode_weight_bytes, use.machine_read_gbs) == (108471552, 30.0)
    openai_endpoint.metrics = lambda: f"{PROCESS_CPU} 1\n"  # vLLM, llama.cpp: no such figure, no bandwidth
    meter = machine_meter(Target(openai_endpoint.url, "m"))
    meter.start()
    use = meter.stop()
    assert (use.decode_weight_bytes, use.machine_read_gbs) == (None, None)
