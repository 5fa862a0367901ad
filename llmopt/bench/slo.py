"""Service-level objectives as a setting spells them: `ttft=500ms,tpot=50ms,e2e=2s`. The sweep, the
measures and the run folder all read them, so they live beside rundir.py, below every wing."""

from __future__ import annotations


def parse_slo(spec: str | None) -> dict[str, float]:
    """'ttft=500ms,tpot=50ms,e2e=2s' -> {'ttft': 0.5, 'tpot': 0.05, 'e2e': 2.0} (seconds)."""
    if not spec:
        return {}
    slo: dict[str, float] = {}
    for part in spec.split(","):
        name, _, value = part.partition("=")
        name, value = name.strip().lower(), value.strip().lower()
        if name not in ("ttft", "tpot", "itl", "e2e") or not value:
            raise ValueError(f"bad SLO {part!r}: use ttft=500ms,tpot=50ms,itl=..,e2e=..")
        if value.endswith("ms"):
            seconds = float(value[:-2]) / 1000
        elif value.endswith("s"):
            seconds = float(value[:-1])
        else:
            seconds = float(value) / 1000  # a bare number is milliseconds, as in vllm bench serve
        slo[name] = seconds
    return slo
