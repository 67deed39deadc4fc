"""Calibration against the Locust experiments: every fixed-work cell of an experiment's
output, simulated with the same settings, beside what the real replicas reported.

An experiment folder (``python -m loadtests.experiment --out DIR``) holds ``profile.json``
(the settings and cells) and ``results.csv`` (one row per cell, vLLM's own counters). Each
gateway cell with fixed work (``load = "sessions"``: ``users`` Locust users, user i
replaying the i-th trajectory as loaded, ``max_steps`` steps, no think time, the recorded
reply lengths) becomes a ``SimConfig`` with the same replicas, KV pool, routing policy and
strategy; the simulator's replica shape comes from the ``cpu-tiny`` preset with the cell's
KV pool.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offline.sim.cluster import CellResult, SimConfig, simulate
from offline.sim.workload import Workload
from router.cost import CostModel


@dataclass(frozen=True, slots=True)
class LocustCell:
    name: str
    strategy: str
    routing: str
    users: int
    kv_cache_bytes: int
    measured: dict[str, str]

    def number(self, column: str) -> float:
        return float(self.measured[column])


def read_experiment(folder: Path) -> tuple[dict[str, Any], list[LocustCell]]:
    """The experiment's settings and its fixed-work gateway cells that have results."""
    profile = json.loads((folder / "profile.json").read_text())
    with (folder / "results.csv").open(newline="") as f:
        rows = {row["cell"]: row for row in csv.DictReader(f)}
    cells = [
        LocustCell(
            name=c["cell"],
            strategy=c["strategy"],
            routing=c["routing"],
            users=int(c["users"]),
            kv_cache_bytes=int(c["kv_cache_bytes"]),
            measured=rows[c["cell"]],
        )
        for c in profile["cells"]
        if c["arm"] == "gateway" and c["load"] == "sessions" and c["cell"] in rows
    ]
    return profile["settings"], cells


def sim_config(cell: LocustCell, settings: dict[str, Any], base: CostModel) -> SimConfig:
    if str(settings.get("think_time", "0")) != "0":
        raise ValueError(
            f"cell {cell.name}: think time {settings['think_time']!r}; only think_time 0 "
            "(saturation) is compared"
        )
    cost = base.with_pool(cell.kv_cache_bytes // base.kv_bytes_per_token)
    return SimConfig(
        policy=cell.routing,
        strategy=cell.strategy,
        cost=cost,
        replicas=int(settings["replicas"]),
        concurrency=cell.users,
        sessions=cell.users,
        shuffle=False,
        think_s=0.0,
        duration_s=float(settings.get("run_time_s", 300.0)) * 10,
        warmup_s=0.0,
    )


@dataclass(frozen=True, slots=True)
class Compared:
    cell: LocustCell
    simulated: CellResult

    def row(self) -> dict[str, Any]:
        sim = self.simulated.summary()
        measured_hit = self.cell.number("vllm_prefix_hit_rate")
        return {
            "cell": self.cell.name,
            "hit measured": measured_hit,
            "hit simulated": sim["prefix_hit_rate"],
            "hit diff (points)": 100 * (sim["prefix_hit_rate"] - measured_hit),
            "queue p95 measured s": self.cell.number("vllm_queue_time_p95_s"),
            "queue p95 simulated s": sim["queue_p95_s"],
            "steps/min measured": self.cell.number("session_steps_per_min"),
            "steps/min simulated": sim["session_steps_per_min"],
            "prompt tokens measured": self.cell.number("vllm_prompt_tokens"),
            "prompt tokens simulated": self.simulated.prefix_queries,
        }


def compare(
    workloads: dict[str, Workload],
    cells: list[LocustCell],
    settings: dict[str, Any],
    base: CostModel,
) -> list[Compared]:
    """Simulate each cell; ``workloads`` is keyed by strategy."""
    return [
        Compared(cell, simulate(workloads[cell.strategy], sim_config(cell, settings, base)))
        for cell in cells
    ]


def same_order(measured: list[float], simulated: list[float]) -> bool:
    """Do the two rank the cells alike (ties in either count as agreeing)?"""
    n = len(measured)
    return all(
        (measured[i] - measured[j]) * (simulated[i] - simulated[j]) >= 0
        for i in range(n)
        for j in range(i + 1, n)
    )


def markdown(compared: list[Compared]) -> str:
    rows = [c.row() for c in compared]
    if not rows:
        return "no fixed-work gateway cells with results"
    keys = list(rows[0])

    def fmt(key: str, v: Any) -> str:
        if key.startswith("hit") and "diff" not in key:
            return f"{100 * v:.1f}%"
        if isinstance(v, float):
            return f"{v:+.1f}" if "diff" in key else f"{v:,.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(k, r[k]) for k in keys) + " |" for r in rows]
    queue = same_order(
        [r["queue p95 measured s"] for r in rows], [r["queue p95 simulated s"] for r in rows]
    )
    steps = same_order(
        [r["steps/min measured"] for r in rows], [r["steps/min simulated"] for r in rows]
    )
    within = sum(abs(r["hit diff (points)"]) <= 5 for r in rows)
    lines.append("")
    lines.append(
        f"prefix hit within 5 points: {within} of {len(rows)} cells; same order by queue p95: "
        f"{'yes' if queue else 'no'}; by steps/min: {'yes' if steps else 'no'}"
    )
    return "\n".join(lines)
