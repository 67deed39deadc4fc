"""A front's CPU in a cell: its own process and its children's (``tree_cpu_s``), per
completed step (``front_cpu``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from loadtests.cell_processes import tree_cpu_s
from loadtests.results import FRONT_METRICS, front_cpu

# A parent that starts a child which burns 0.5 s of its own CPU, says so, and waits.
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", '''
    import sys, time
    while time.process_time() < 0.5:
        pass
    print("burnt", flush=True)
    sys.stdin.read()
    '''], stdin=subprocess.PIPE, stdout=sys.stdout)
    sys.stdin.read()
    child.stdin.close()
    child.wait()
    """
)


def test_a_fronts_cpu_counts_its_child_processes() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"burnt\n"
        # The child's 0.5 s and the parent's own; /proc counts whole clock ticks, which can
        # trail the child's own clock (0.29 s was read for 0.3 s burnt), so some slack.
        assert tree_cpu_s(parent.pid) >= 0.4
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(10)
    assert tree_cpu_s(parent.pid) == 0.0  # gone: nothing to count


def test_front_cpu_is_per_completed_step_and_empty_without_a_front() -> None:
    assert front_cpu(1.5, 300) == {"front_cpu_s": 1.5, "front_cpu_ms_per_step": 5.0}
    assert front_cpu(1.5, 0) == {"front_cpu_s": 1.5, "front_cpu_ms_per_step": None}
    assert front_cpu(None, 300) == dict.fromkeys(FRONT_METRICS)
