"""The cost of a token in the machine's own terms, per point: the server's CPU seconds per 1,000 output
tokens and the cores that implies (CPU seconds over wall seconds), and the machine's joules per output
token, from what each run's meter read (machine_meter.py). Several runs are pooled: their seconds,
joules and tokens summed. A figure is None, never a guess, when any run could not read it; its
`*_source` field then says why ("not available here" and the reason, in the report and the console)."""

from __future__ import annotations

from llmopt.bench.observe.machine_meter import MachineUse
from llmopt.bench.rundir import NOT_MEASURED


def pooled(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values)


def per(value: float | None, amount: float, scale: float = 1.0) -> float | None:
    return None if value is None or amount <= 0 else value / amount * scale


def source_of(uses: list[MachineUse | None], value: str, source: str) -> str:
    """Where the runs' figure `value` came from (their `source` field), or the reason the first run
    without it gave."""
    if not uses or any(u is None for u in uses):
        return NOT_MEASURED
    missing = [u for u in uses if getattr(u, value) is None]
    return getattr(missing[0] if missing else uses[0], source)


def decode_read_fields(uses: list[MachineUse | None], itl_median_ms: float | None) -> dict:
    """The decode reads a point implies: the server's weight bytes a step over the median ITL (a step
    of a batch gives each stream one token, so the ITL is the step's time), in GB/s, and that as a share
    of the machine's read bandwidth (None where the server does not say its bytes or runs elsewhere)."""
    read = [u for u in uses if u is not None and u.decode_weight_bytes is not None]
    weight_bytes = read[0].decode_weight_bytes if read else None
    gbs = per(weight_bytes, (itl_median_ms or 0) / 1000, 1e-9)
    machine = next((u.machine_read_gbs for u in read if u.machine_read_gbs is not None), None)
    return {
        "decode_weight_bytes": weight_bytes,
        "decode_read_gbs": gbs,
        "machine_read_gbs": machine,
        "decode_read_share": per(gbs, machine or 0),
    }


def token_cost_fields(uses: list[MachineUse | None], output_tokens: int) -> dict:
    """A point summary's machine-cost fields from its runs' readings and its output tokens."""
    wall = sum(u.wall_s for u in uses if u is not None)
    cpu = pooled([u.cpu_s if u is not None else None for u in uses])
    energy = pooled([u.energy_j if u is not None else None for u in uses])
    domains = next((u.energy_domains for u in uses if u is not None and u.energy_domains), None)
    return {
        "server_cpu_s": cpu,
        "server_cores": per(cpu, wall),
        "cpu_s_per_1k_tokens": per(cpu, output_tokens, 1000),
        "cpu_source": source_of(uses, "cpu_s", "cpu_source"),
        "energy_j": energy,
        "joules_per_token": per(energy, output_tokens),
        "energy_source": source_of(uses, "energy_j", "energy_source"),
        "energy_domains": domains if energy is not None else None,
    }
