"""The CPU time of a process and everything it started: what a server the bench launched has spent, in
seconds of user plus system time, read the same way at a point's start and end. A server does its
work in threads (counted in their process) and often in child processes (vLLM's engine core, a peer's
workers), so the whole tree is summed: each live process's own time and that of the children it has
already reaped (a child that ended and was waited for hands its time to its parent, so nothing is
counted twice, and a short-lived worker is not lost).

Read with psutil where it is installed, else from /proc (Linux) directly."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import psutil
except ImportError:  # not a dependency: /proc does the same on Linux
    psutil = None

PROC = Path("/proc")


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` and all its descendants (with their reaped children's);
    None when the process is gone or cannot be read here."""
    if psutil is not None:
        return psutil_tree_seconds(pid)
    return proc_tree_seconds(pid)


def cpu_reader_name() -> str:
    """Which reader tree_cpu_seconds uses here, as a run's summary names it."""
    return "psutil" if psutil is not None else "/proc"


def psutil_tree_seconds(pid: int) -> float | None:
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    total = 0.0
    for process in processes:
        try:
            t = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a child that ended between the listing and now: its time went to its parent
        total += t.user + t.system + t.children_user + t.children_system
    return total


def proc_stat(pid: int, proc: Path = PROC) -> tuple[int, float] | None:
    """(parent pid, own + reaped children's CPU seconds) from /proc/<pid>/stat; None once it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after its last ")" count.
    fields = text[text.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])  # fields 14-17 of proc(5)
    return ppid, (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


def proc_tree_seconds(pid: int, proc: Path = PROC) -> float | None:
    """tree_cpu_seconds from /proc: every process's parent read once, then `pid`'s descendants summed."""
    if not (proc / str(pid)).is_dir():
        return None
    stats: dict[int, tuple[int, float]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name), proc)) is not None:
            stats[int(entry.name)] = stat
    if pid not in stats:
        return None
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += stats[current][1]
        todo += children.get(current, [])
    return total
