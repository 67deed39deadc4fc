"""Issue 9's judgement of priced sticky routing, read off a simulation's cells.

At the knee load, the priced sticky policy (``sticky_cost``) must keep its prefix-hit rate
within 1 point of today's ``sticky`` and bring its p95 queue time within 10% of
``least_loaded``'s; ``round_robin`` is reported beside them. Both bounds are one-sided:
they guard against what a move-pricing policy could lose (hits to sticky's, queueing to
least-loaded's), so a higher hit rate or a lower queue passes.

The knee is the first load at which today's ``sticky`` (the gateway's default, which the
Locust step load also runs) reaches 90% of its best throughput over the loads simulated
(``offline.locust_runs.knee``, the experiments' rule): past it more sessions only queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offline.locust_runs import knee
from offline.sim.cluster import SimConfig
from offline.sim.result import CellResult

HIT_POINTS = 1.0  # sticky_cost's hit rate may fall at most this far below sticky's
QUEUE_SHARE = 0.10  # and its p95 queue time rise at most this far above least_loaded's
JUDGED = ("sticky", "sticky_cost", "least_loaded")


@dataclass(frozen=True, slots=True)
class Judgement:
    strategy: str
    load: str
    loads: int  # loads the knee was chosen from
    cells: dict[str, CellResult]  # by policy, at the knee load

    @staticmethod
    def p95(cell: CellResult) -> float:
        return float(cell.summary()["queue_p95_s"])

    @property
    def hit_points(self) -> float:
        """sticky_cost's hit rate less sticky's, in points."""
        return 100 * (self.cells["sticky_cost"].hit_rate - self.cells["sticky"].hit_rate)

    @property
    def queue_ratio(self) -> float:
        """sticky_cost's p95 queue time over least_loaded's."""
        least = self.p95(self.cells["least_loaded"])
        cost = self.p95(self.cells["sticky_cost"])
        return cost / least if least > 0 else (1.0 if cost == 0 else float("inf"))

    # Compared at a precision far below any figure's (a bound met exactly passes).
    @property
    def hit_ok(self) -> bool:
        return round(self.hit_points, 9) >= -HIT_POINTS

    @property
    def queue_ok(self) -> bool:
        return round(self.queue_ratio, 9) <= 1 + QUEUE_SHARE


def _load_value(config: SimConfig) -> float:
    rate = config.concurrency if config.concurrency is not None else config.arrival_rate
    assert rate is not None
    return float(rate)


def judge(configs: Sequence[SimConfig], results: Sequence[CellResult]) -> list[Judgement]:
    """One judgement per strategy whose cells include sticky, sticky_cost and least_loaded
    at every load; ``configs[i]`` is the cell ``results[i]`` ran."""
    cells = {(c.strategy, c.policy, c.load): r for c, r in zip(configs, results, strict=True)}
    loads = sorted({(_load_value(c), c.load) for c in configs})
    judgements = []
    for strategy in dict.fromkeys(c.strategy for c in configs):
        if any((strategy, p, load) not in cells for p in JUDGED for _, load in loads):
            continue
        curve = [
            {"load": load, "session_steps_per_min": cells[(strategy, "sticky", load)].steps_per_min}
            for _, load in loads
        ]
        at = knee(curve)
        assert at is not None
        policies = (*JUDGED, "round_robin")
        judgements.append(
            Judgement(
                strategy,
                at["load"],
                len(loads),
                {
                    p: cells[(strategy, p, at["load"])]
                    for p in policies
                    if (strategy, p, at["load"]) in cells
                },
            )
        )
    return judgements


def markdown(judgements: Sequence[Judgement]) -> str:
    if not judgements:
        return ""
    lines = [
        "## Priced sticky at the knee",
        "",
        "Knee: the first load where today's sticky reaches 90% of its best throughput"
        + (
            "."
            if judgements[0].loads > 1
            else " (one load simulated: judged there; give several loads to find the knee)."
        ),
        f"Bar: sticky_cost's hit rate at most {HIT_POINTS:g} point below sticky's, its p95 "
        f"queue at most {100 * QUEUE_SHARE:.0f}% above least_loaded's (higher hits and lower "
        "queues pass).",
        "",
        "| strategy | knee load | policy | prefix hit | queue p95 s | steps/min |",
        "|---|---|---|---|---|---|",
    ]
    for j in judgements:
        for policy, cell in j.cells.items():
            row = cell.summary()  # rounded as the cells' table is
            lines.append(
                f"| {j.strategy} | {j.load} | {policy} | {100 * row['prefix_hit_rate']:.1f}% | "
                f"{row['queue_p95_s']:.2f} | {row['session_steps_per_min']:,.1f} |"
            )
    lines.append("")
    for j in judgements:
        lines.append(
            f"- {j.strategy} at {j.load}: sticky_cost's hit rate {j.hit_points:+.1f} points "
            f"against sticky's ({'pass' if j.hit_ok else 'FAIL'}); its p95 queue "
            f"{j.queue_ratio:.2f}x least_loaded's ({'pass' if j.queue_ok else 'FAIL'})"
        )
    return "\n".join(lines)
