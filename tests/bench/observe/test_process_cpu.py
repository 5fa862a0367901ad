"""The CPU time of a process tree, as the bench reads a server it started: this test process's tree,
while a child it started burns a known amount of CPU, and after the child has ended and been reaped
(its time then counts in its parent's). Both readers: psutil's and /proc's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from llmopt.bench.observe import process_cpu
from llmopt.bench.observe.process_cpu import proc_tree_seconds, psutil_tree_seconds

# Burns about `seconds` of CPU, says how much it used, then waits to be told to end.
BURNER = """
import sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
print(time.process_time(), flush=True)
sys.stdin.readline()
"""

READERS = [pytest.param(proc_tree_seconds, id="proc")]
if process_cpu.psutil is not None:
    READERS.append(pytest.param(psutil_tree_seconds, id="psutil"))


def own_cpu() -> float:
    """This process's CPU seconds (its threads); a test's reading of the tree includes them."""
    return time.process_time()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("reader", READERS)
def test_a_childs_cpu_counts_while_it_runs_and_after_it_is_reaped(reader):
    before, mine = reader(os.getpid()), own_cpu()
    child = subprocess.Popen(
        [sys.executable, "-c", BURNER, "0.4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    burned = float(child.stdout.readline())  # the child's own count, at the end of its loop
    alive = reader(os.getpid())
    ours = own_cpu() - mine
    # The child's burn and its start-up, plus whatever this process used meanwhile; clock ticks of 10 ms.
    assert burned >= 0.4
    assert burned - 0.05 <= alive - before <= burned + ours + 0.5
    child.stdin.write("\n")
    child.stdin.close()
    child.wait()
    reaped = reader(os.getpid())
    assert reaped >= alive - 0.05  # the ended child's time moved into its parent's: nothing lost
    assert reader(child.pid) is None  # gone


def test_a_process_that_is_not_there_reads_none():
    assert process_cpu.tree_cpu_seconds(2**22 + 12345) is None
