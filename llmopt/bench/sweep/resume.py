"""Whether a run may be continued: `--resume` adds points to a run only under the settings that its
finished points were measured with, or one run would mix two experiments under one name."""

from __future__ import annotations

from llmopt.bench.bench_error import BenchError

# Settings that do not change what a point measures: where the settings were read from (a recipe's
# values are compared one by one), how long to wait for a stalled server before giving up, and how often
# the server's metrics are sampled.
NOT_COMPARED = frozenset({"recipe", "request_timeout", "metrics_interval"})


def resume_conflicts(stored: dict, new: dict) -> list[str]:
    """ "workload was 'random', now 'copy'" for each compared setting that differs between the stored
    settings (summary.json's `settings.config`) and the new ones (`BenchConfig.recorded()`). A setting the
    stored run does not record (an older bench wrote it) is not compared."""
    return [
        f"{name} was {stored[name]!r}, now {value!r}"
        for name, value in new.items()
        if name not in NOT_COMPARED and name in stored and stored[name] != value
    ]


def check_resumable(stored: dict, new: dict) -> None:
    """BenchError naming every setting that differs; nothing when the run may be continued."""
    conflicts = resume_conflicts(stored, new)
    if conflicts:
        raise BenchError(
            f"cannot resume: {'; '.join(conflicts)} (resume with the run's settings, or start another "
            "--run-name)"
        )
