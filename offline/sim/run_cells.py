"""Simulate a list of cells, one after another or in forked worker processes."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from offline.sim.cluster import SimConfig, simulate
from offline.sim.result import CellResult
from offline.sim.workload import Workload

# The workload and the progress queue, inherited by forked workers (not pickled per cell).
_WORKLOAD: Workload | None = None
_PROGRESS: Any = None


def _run_cell(index: int, config: SimConfig) -> tuple[int, CellResult]:
    assert _WORKLOAD is not None

    def report(t: float) -> None:
        if _PROGRESS is not None:
            _PROGRESS.put((index, t))

    return index, simulate(_WORKLOAD, config, report)


def run_cells(
    workload: Workload,
    configs: Sequence[SimConfig],
    jobs: int,
    on_progress: Callable[[int, float], None],
) -> list[CellResult | None]:
    """Every cell's result, in the order of ``configs``; ``on_progress(cell index,
    simulated seconds)`` as each advances, and with its duration once it is done."""
    global _WORKLOAD, _PROGRESS
    _WORKLOAD = workload
    results: list[CellResult | None] = [None] * len(configs)
    if jobs == 1 or len(configs) == 1:
        for i, c in enumerate(configs):
            results[i] = simulate(workload, c, lambda t, i=i: on_progress(i, t))
        return results
    ctx = multiprocessing.get_context("fork")
    _PROGRESS = ctx.Queue()
    with ctx.Pool(jobs) as workers:
        pending = [workers.apply_async(_run_cell, (i, c)) for i, c in enumerate(configs)]
        while pending:
            while not _PROGRESS.empty():
                on_progress(*_PROGRESS.get())
            for job in [j for j in pending if j.ready()]:
                i, result = job.get()
                results[i] = result
                on_progress(i, configs[i].duration_s)
                pending.remove(job)
            time.sleep(0.1)
    _PROGRESS = None
    return results
