"""Processes on this host, read from ``/proc``: alive or not, resident memory of a tree,
waiting for one to exit."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists"; it has exited for every purpose here.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (API server + engine core)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, ()))
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
    return total


def wait_exit(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return True
        elif not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False
