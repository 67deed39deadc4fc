"""Test support: an in-process assignment map and a pool whose state tests set directly."""

from __future__ import annotations

import asyncio
import time

from router import ReplicaMetrics, ReplicaPool


class MemoryAssignments:
    """Minimal in-process implementation of router.AssignmentStore (compare-and-set with TTL).

    The awaits inside yield to the event loop so concurrent callers interleave the way they
    would against a networked store.
    """

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], tuple[str, float]] = {}

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        await asyncio.sleep(0)
        entry = self._data.get((tenant, session))
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]

    async def set_assignment(
        self, tenant: str, session: str, replica: str, *, expected: str | None, ttl_s: float
    ) -> str:
        current = await self.get_assignment(tenant, session)
        if current in (None, expected, replica):
            self._data[(tenant, session)] = (replica, time.monotonic() + ttl_s)
            return replica
        return current


def static_pool(loads: list[float], healthy: list[bool] | None = None) -> ReplicaPool:
    """A pool that is never started: tests set each replica's health and load directly."""
    pool = ReplicaPool([f"http://replica-{i}:8000" for i in range(len(loads))])
    for i, replica in enumerate(pool.replicas):
        replica.healthy = True if healthy is None else healthy[i]
        replica.metrics = ReplicaMetrics(running=loads[i], waiting=0)
    return pool
