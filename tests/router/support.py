"""Test support: a pool whose replica state tests set directly, and a store that must not
be used."""

from __future__ import annotations

from router import ReplicaMetrics, ReplicaPool


def static_pool(loads: list[float], healthy: list[bool] | None = None) -> ReplicaPool:
    """A pool that is never started: tests set each replica's health and load directly."""
    pool = ReplicaPool([f"http://replica-{i}:8000" for i in range(len(loads))])
    for i, replica in enumerate(pool.replicas):
        replica.healthy = True if healthy is None else healthy[i]
        replica.metrics = ReplicaMetrics(running=loads[i], waiting=0)
    return pool


class NoStore:
    """An assignment store that must not be used."""

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        raise AssertionError("the policy read the assignment the caller had read")

    async def set_assignment(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("the policy wrote the assignment the caller writes")
