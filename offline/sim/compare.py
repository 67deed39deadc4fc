"""Calibration against the Locust experiments: every fixed-work cell of an experiment's
output, simulated with the same settings, beside what the real replicas reported.

An experiment folder (``python -m loadtests.experiment --out DIR``) holds ``profile.json``
(the settings and cells) and ``results.csv`` (one row per cell, vLLM's own counters). Each
cell with fixed work (``load = "sessions"``: ``users`` Locust users, user i replaying the
i-th trajectory as loaded, ``max_steps`` steps, no think time, the recorded reply lengths)
becomes a ``SimConfig`` with the same replicas, KV pool, routing policy and strategy; the
simulator's replica shape comes from the ``cpu-tiny`` preset with the cell's KV pool. The
arms (``ARMS``): foldgate's (``arm = "gateway"``: its ``routing`` and ``strategy``),
vllm-router's (``arm = "vllm_router"``: its ``router_policy``, one the simulator models
(``router.PEER_POLICY_NAMES``), over the harness's prompts as sent, ``base``) and the
straight round-robin (``arm = "no_gateway"``: ``round_robin`` over ``base``). A figure a
results row lacks (a cell transcribed from a report that did not give it) is NaN, orders
nothing and is shown as such.

Several runs of one profile can be compared at once: the measured figures are their mean.
Two cells count as ordered (by queue time or throughput) only where their difference is
larger than the run-to-run spread (``offline.sim.ordering``): two runs of one profile, with
nothing changed, move a cell's figure by that much on this shared machine, so a smaller
difference between two cells is not evidence of an order, and is a tie that either order
agrees with. With the cost model's ``step_jitter`` each seed is another draw of the
replicas' step times; the simulated figures pool ``seeds`` runs, and the simulation
orders a pair only where its seeds' mean difference is clear of their noise
(``simulated_pairs``); a simulated tie agrees with either measured order.

What the simulation replays (``REPLAYS``): ``policy``, the cell's routing policy, run by
the simulator (the default); ``routes``, the replica each request went to as the run's
Locust users logged it (``requests.jsonl``); ``schedule``, those routes and the times the
requests were sent. ``routes`` and ``schedule`` check the replica model (prefix cache,
eviction, admission) apart from the routing, which in a real run follows its timing:
round-robin's global counter interleaves sessions as their replies happen to end, and a
burst of new sessions is placed by the load the gateway sees, which counts a request in
flight only once its routing (with the session's assignment write) has finished. Under
``schedule`` the queue times and throughput follow the run's pace, not the model's: compare
its hit rates only. Replaying, every run is simulated with its own log and the simulated
figures pool them (tokens, requests and time summed).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from offline.locust_runs import load_requests
from offline.sim.cluster import SimConfig, simulate
from offline.sim.ordering import Ordering, ordering
from offline.sim.result import CellResult
from offline.sim.serving_path import ServedRequest
from offline.sim.workload import Workload
from router import PEER_POLICY_NAMES
from router.cost import CostModel

# vLLM's bucket bounds for vllm:request_queue_time_seconds (REQUEST_LATENCY_BUCKETS in
# vllm/v1/metrics/buckets.py, 0.32.0): a measured p95 is the bound of the bucket holding it
# (loadtests/vllm_metrics.py), so the simulated one is read the same way.
QUEUE_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                      50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# The figures compared, as (results.csv column, label); the first three are ordered.
MEASURES = (
    ("vllm_queue_time_mean_s", "queue mean s"),
    ("vllm_queue_time_p95_s", "queue p95 ≤ s"),
    ("session_steps_per_min", "steps/min"),
    ("ttft_p50_ms", "TTFT p50 ms"),
)
ORDERED = 3


def bucket_bound(seconds: float) -> float:
    return next((b for b in QUEUE_TIME_BUCKETS if seconds <= b), QUEUE_TIME_BUCKETS[-1])


@dataclass(frozen=True, slots=True)
class LocustCell:
    """One measured cell; ``routing`` is the policy the simulator runs for it."""

    name: str
    strategy: str
    routing: str
    users: int
    kv_cache_bytes: int
    measured: dict[str, str]
    folder: Path
    arm: str = "gateway"

    def number(self, column: str) -> float:
        value = self.measured.get(column)
        return float(value) if value not in (None, "") else float("nan")

    def served(self) -> list[ServedRequest]:
        """The cell's requests as its Locust users logged them."""
        records = (ServedRequest.from_log(r) for r in load_requests(self.folder / self.name))
        return [r for r in records if r is not None]


ARMS = ("gateway", "vllm_router", "no_gateway")


def simulated_arm(cell: dict[str, Any]) -> tuple[str, str] | None:
    """The (policy, strategy) the simulator runs for a measured cell of ``profile.json``,
    or None for an arm it does not model."""
    arm = cell.get("arm", "gateway")
    if arm == "gateway":
        return cell["routing"], cell["strategy"]
    if arm == "vllm_router":
        policy = cell.get("router_policy") or cell.get("routing")
        return (policy, "base") if policy in PEER_POLICY_NAMES else None
    if arm == "no_gateway":
        return "round_robin", "base"
    return None


def read_experiment(folder: Path) -> tuple[dict[str, Any], list[LocustCell]]:
    """The experiment's settings and its fixed-work cells of the arms the simulator
    models (``simulated_arm``) that have results."""
    profile = json.loads((folder / "profile.json").read_text())
    with (folder / "results.csv").open(newline="") as f:
        rows = {row["cell"]: row for row in csv.DictReader(f)}
    cells = []
    for c in profile["cells"]:
        simulated = simulated_arm(c)
        if simulated is None or c["load"] != "sessions" or c["cell"] not in rows:
            continue
        policy, strategy = simulated
        cells.append(
            LocustCell(
                name=c["cell"],
                strategy=strategy,
                routing=policy,
                users=int(c["users"]),
                kv_cache_bytes=int(c["kv_cache_bytes"]),
                measured=rows[c["cell"]],
                folder=folder,
                arm=c.get("arm", "gateway"),
            )
        )
    return profile["settings"], cells


def logged_schedule(
    cell: LocustCell, workload: Workload
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], float]]:
    """The cell's requests as its Locust users logged them: (session, step) -> replica
    index, and -> send time (seconds from the run's first request). Session i replays the
    workload's i-th trajectory, as Locust user i does. Replicas are numbered by URL: they
    are alike, only which requests share one matters. Raises ValueError when a request the
    simulation sends has no logged replica."""
    order = list(workload.trajectories)
    if cell.users > len(order):
        raise ValueError(
            f"cell {cell.name}: {cell.users} users over {len(order)} trajectories; the log "
            "cannot tell apart two sessions of one trajectory"
        )
    records = [
        r for r in load_requests(cell.folder / cell.name) if r.get("replica") and r.get("ok")
    ]
    urls = sorted({r["replica"] for r in records})
    t0 = min((float(r["start"]) for r in records), default=0.0)
    logged = {(r.get("trajectory"), r.get("step")): r for r in records}
    routes, times = {}, {}
    for session, trajectory in enumerate(order[: cell.users]):
        for step in range(len(workload.runs[(trajectory, cell.strategy)].steps)):
            record = logged.get((trajectory, step))
            if record is None:
                raise ValueError(
                    f"cell {cell.name}: no logged replica for {trajectory} step {step} in "
                    f"{cell.folder / cell.name}"
                )
            routes[(session, step)] = urls.index(record["replica"])
            times[(session, step)] = float(record["start"]) - t0
    return routes, times


def pooled(results: list[CellResult]) -> CellResult:
    """Several simulated runs of one cell as one: counters, requests and time summed."""
    first = results[0]
    return CellResult(
        policy=first.policy,
        strategy=first.strategy,
        load=first.load,
        window_s=sum(r.window_s for r in results),
        requests=sum(r.requests for r in results),
        prefix_queries=sum(r.prefix_queries for r in results),
        prefix_hits=sum(r.prefix_hits for r in results),
        queue_s=[q for r in results for q in r.queue_s],
        ttft_s=[t for r in results for t in r.ttft_s],
        preemptions=sum(r.preemptions for r in results),
        moves=sum(r.moves for r in results),
        sessions_started=sum(r.sessions_started for r in results),
    )


def sim_config(
    cell: LocustCell,
    settings: dict[str, Any],
    base: CostModel,
    routes: dict[tuple[int, int], int] | None = None,
    send_times: dict[tuple[int, int], float] | None = None,
    seed: int = 0,
) -> SimConfig:
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
        routes=routes,
        send_times=send_times,
        seed=seed,
    )


@dataclass(frozen=True, slots=True)
class Compared:
    """One cell: its measured rows (one per run of the profile) and its simulations (one
    per seed, or per run when a run's log is replayed), pooled in ``simulated``."""

    runs: tuple[LocustCell, ...]
    simulations: tuple[CellResult, ...]

    @property
    def name(self) -> str:
        return self.runs[0].name

    @property
    def simulated(self) -> CellResult:
        return pooled(list(self.simulations))

    def measured(self, column: str) -> float:
        return float(np.mean([c.number(column) for c in self.runs]))

    def simulated_figure(self, column: str, sim: CellResult | None = None) -> float:
        """The figure of the pooled simulations, or of one of them."""
        sim = self.simulated if sim is None else sim
        if column == "vllm_prefix_hit_rate":
            return sim.hit_rate
        if column == "vllm_queue_time_mean_s":
            return float(np.mean(sim.queue_s)) if sim.queue_s else 0.0
        if column == "vllm_queue_time_p95_s":
            return bucket_bound(float(np.percentile(sim.queue_s, 95))) if sim.queue_s else 0.0
        if column == "session_steps_per_min":
            return sim.steps_per_min
        if column == "ttft_p50_ms":
            return 1e3 * float(np.median(sim.ttft_s)) if sim.ttft_s else 0.0
        raise KeyError(column)

    def row(self) -> dict[str, Any]:
        hit = self.measured("vllm_prefix_hit_rate")
        sim_hit = self.simulated.hit_rate
        row: dict[str, Any] = {
            "cell": self.name,
            "hit measured": hit,
            "hit simulated": sim_hit,
            "hit diff (points)": 100 * (sim_hit - hit),
        }
        for column, label in MEASURES:
            row[f"{label} measured"] = self.measured(column)
            row[f"{label} simulated"] = self.simulated_figure(column)
        row["prompt tokens measured"] = self.measured("vllm_prompt_tokens")
        row["prompt tokens simulated"] = self.simulated.prefix_queries / len(self.simulations)
        return row


def read_runs(folders: list[Path]) -> tuple[dict[str, Any], list[tuple[LocustCell, ...]]]:
    """Several runs of one profile: the first run's settings, and per cell its row from
    every run (cells missing from any run are left out)."""
    read = [read_experiment(f) for f in folders]
    settings = read[0][0]
    by_name = [{c.name: c for c in cells} for _, cells in read]
    return settings, [
        tuple(run[c.name] for run in by_name)
        for c in read[0][1]
        if all(c.name in run for run in by_name)
    ]


REPLAYS = ("policy", "routes", "schedule")


def compare(
    workloads: dict[str, Workload],
    cells: list[tuple[LocustCell, ...]],
    settings: dict[str, Any],
    base: CostModel,
    replay: str = "policy",
    seeds: int = 1,
) -> list[Compared]:
    """Simulate each cell (its runs' settings are one profile's); ``workloads`` is keyed
    by strategy. ``replay``: ``policy`` runs the cell's policy once per seed (0 to
    ``seeds`` - 1); ``routes`` and ``schedule`` replay each run's log (see the module's
    docstring), once per run and seed. The simulations are pooled."""
    if replay not in REPLAYS:
        raise ValueError(f"replay must be one of {REPLAYS}, got {replay!r}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    compared = []
    for runs in cells:
        workload = workloads[runs[0].strategy]
        simulated = []
        for seed in range(seeds):
            if replay == "policy":
                config = sim_config(runs[0], settings, base, seed=seed)
                simulated.append(simulate(workload, config))
                continue
            for run in runs:
                routes, times = logged_schedule(run, workload)
                timed = times if replay == "schedule" else None
                config = sim_config(run, settings, base, routes, timed, seed=seed)
                simulated.append(simulate(workload, config))
        compared.append(Compared(runs, tuple(simulated)))
    return compared


def orderings(compared: list[Compared]) -> dict[str, Ordering]:
    """Per ordered figure: how the simulated cells rank the pairs the measured runs order."""
    n_runs = len(compared[0].runs) if compared else 0
    n_sims = len(compared[0].simulations) if compared else 0
    checks = {}
    for column, label in MEASURES[:ORDERED]:
        measured = [[c.runs[r].number(column) for c in compared] for r in range(n_runs)]
        simulated = [
            [c.simulated_figure(column, c.simulations[s]) for c in compared] for s in range(n_sims)
        ]
        checks[label] = ordering(measured, simulated)
    return checks


def markdown(compared: list[Compared]) -> str:
    rows = [c.row() for c in compared]
    if not rows:
        return "no fixed-work cells with results"
    keys = list(rows[0])

    def fmt(key: str, v: Any) -> str:
        if key.startswith("hit") and "diff" not in key:
            return f"{100 * v:.1f}%"
        if "diff" in key:
            return f"{v:+.1f}"
        if "tokens" in key or "TTFT" in key:
            return f"{v:,.0f}"
        if "steps/min" in key:
            return f"{v:.1f}"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(k, r[k]) for k in keys) + " |" for r in rows]
    within = sum(abs(r["hit diff (points)"]) <= 5 for r in rows)
    runs = len(compared[0].runs)
    sims = len(compared[0].simulations)
    pairs = len(rows) * (len(rows) - 1) // 2
    lines.append("")
    lines.append(
        f"measured: mean of {runs} run{'s' if runs > 1 else ''}; simulated: {sims} "
        f"simulation{'s' if sims > 1 else ''} pooled; prefix hit within 5 points: "
        f"{within} of {len(rows)} cells"
    )
    if runs == 1:
        lines.append(
            "one measured run: its spread is unknown, so every unequal pair counts as ordered"
        )
    for label, o in orderings(compared).items():
        lines.append(
            f"- same order by {label}: {'yes' if o.same else 'no'} ({o.ordered} of {pairs} "
            f"pairs ordered by the measurement, {pairs - o.ordered} ties within its "
            f"run-to-run spread; the simulation orders {o.alike} alike, {o.opposite} the "
            f"other way, {o.tied} as ties)"
        )
    return "\n".join(lines)
