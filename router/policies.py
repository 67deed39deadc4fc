"""Routing policies behind one interface, modelled on llm-d's filter -> scorer -> picker split.

Filter: healthy replicas not excluded by failover. Scorer: load (running + waiting from the
last scrape, plus this gateway's in-flight requests). Picker: per policy.

`sticky` keeps a session on one replica so its prefix cache stays warm; the assignment lives
in the shared store with a TTL so every gateway replica agrees. A session moves only when its
replica is unusable or busier than the least-loaded one by more than `rehome_margin`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from router.assignments import AssignmentStore
from router.pool import ReplicaPool
from router.replica import Replica
from router.telemetry import ROUTING_DECISIONS, SESSION_MOVES

log = logging.getLogger(__name__)


class NoHealthyReplica(RuntimeError):
    """Every replica is down or already tried for this request."""


@dataclass(frozen=True)
class Decision:
    replica: Replica
    reason: str
    # The replica URL the session was assigned to before this decision moved it, if it moved.
    moved_from: str | None = None


def candidates(pool: ReplicaPool, exclude: Collection[str]) -> list[Replica]:
    """Filter step: healthy replicas not excluded (URLs already tried by failover)."""
    found = [r for r in pool.healthy() if r.url not in exclude]
    if not found:
        raise NoHealthyReplica(
            f"no healthy replica among {len(pool.replicas)} (excluded: {sorted(exclude)})"
        )
    return found


class RoutingPolicy(ABC):
    name: str

    async def choose(
        self, tenant: str, session: str, pool: ReplicaPool, exclude: Collection[str] = ()
    ) -> Decision:
        """Pick a replica for one request of (tenant, session); raises NoHealthyReplica."""
        decision = await self._choose(tenant, session, pool, exclude)
        ROUTING_DECISIONS.labels(policy=self.name, reason=decision.reason).inc()
        if decision.moved_from is not None:
            SESSION_MOVES.labels(policy=self.name, reason=decision.reason).inc()
            log.info(
                "session %s/%s moved %s -> %s (%s)",
                tenant,
                session,
                decision.moved_from,
                decision.replica.url,
                decision.reason,
            )
        return decision

    @abstractmethod
    async def _choose(
        self, tenant: str, session: str, pool: ReplicaPool, exclude: Collection[str]
    ) -> Decision: ...


class _LeastLoadedPicker:
    """Lowest load wins; ties rotate, so idle replicas share new sessions instead of the
    first one in the list taking all of them until the next scrape shows its load."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, replicas: Sequence[Replica]) -> Replica:
        low = min(r.load for r in replicas)
        tied = [r for r in replicas if r.load == low]
        self._turn += 1
        return tied[self._turn % len(tied)]


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    async def _choose(
        self, tenant: str, session: str, pool: ReplicaPool, exclude: Collection[str]
    ) -> Decision:
        found = candidates(pool, exclude)
        replica = found[self._next % len(found)]
        self._next += 1
        return Decision(replica, "round_robin")


class LeastLoadedPolicy(RoutingPolicy):
    name = "least_loaded"

    def __init__(self) -> None:
        self._picker = _LeastLoadedPicker()

    async def _choose(
        self, tenant: str, session: str, pool: ReplicaPool, exclude: Collection[str]
    ) -> Decision:
        return Decision(self._picker.pick(candidates(pool, exclude)), "least_loaded")


class StickyPolicy(RoutingPolicy):
    name = "sticky"
    # Compare-and-set rounds before giving up when other gateways keep winning with
    # replicas this gateway cannot use.
    _MAX_ROUNDS = 3

    def __init__(
        self, assignments: AssignmentStore, *, ttl_s: float = 3600.0, rehome_margin: float = 4.0
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if rehome_margin < 0:
            raise ValueError(f"rehome_margin must be >= 0, got {rehome_margin}")
        self._store = assignments
        self.ttl_s = ttl_s
        self.rehome_margin = rehome_margin
        self._picker = _LeastLoadedPicker()

    async def _choose(
        self, tenant: str, session: str, pool: ReplicaPool, exclude: Collection[str]
    ) -> Decision:
        found = candidates(pool, exclude)
        best = self._picker.pick(found)
        usable = {r.url: r for r in found}
        current = await self._store.get_assignment(tenant, session)
        for _ in range(self._MAX_ROUNDS):
            reason = self._reason(pool, current, usable, best, exclude)
            # "sticky" keeps the replica: the write then only refreshes the TTL, unless
            # another gateway moved the session meanwhile.
            target = usable[current] if reason == "sticky" and current else best
            winner = await self._store.set_assignment(
                tenant, session, target.url, expected=current, ttl_s=self.ttl_s
            )
            if winner == target.url:
                return Decision(target, reason, moved_from=None if reason == "sticky" else current)
            # Another gateway changed the assignment first; follow it when we can use it
            # (its move is already recorded there), else decide again against its value.
            if winner in usable:
                return Decision(usable[winner], "followed")
            current = winner
        raise NoHealthyReplica(
            f"session {tenant}/{session}: assignment kept changing to unusable replicas"
        )

    def _reason(
        self,
        pool: ReplicaPool,
        current: str | None,
        usable: dict[str, Replica],
        best: Replica,
        exclude: Collection[str],
    ) -> str:
        """Why the session goes where it goes: "sticky" keeps `current`, the rest move it."""
        if current is None:
            return "new"
        if pool.get(current) is None:
            return "gone"
        if current in exclude:
            return "excluded"
        if current not in usable:
            return "unhealthy"
        if usable[current].load - best.load > self.rehome_margin:
            return "overloaded"
        return "sticky"


_POLICIES: dict[str, type[RoutingPolicy]] = {
    p.name: p for p in (StickyPolicy, RoundRobinPolicy, LeastLoadedPolicy)
}


def make_policy(
    name: str,
    *,
    assignments: AssignmentStore | None = None,
    ttl_s: float = 3600.0,
    rehome_margin: float = 4.0,
) -> RoutingPolicy:
    """Build a policy by config name. The store, TTL and margin matter only to `sticky`."""
    if name not in _POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(_POLICIES))}")
    if name == StickyPolicy.name:
        if assignments is None:
            raise ValueError("routing policy 'sticky' needs an assignment store")
        return StickyPolicy(assignments, ttl_s=ttl_s, rehome_margin=rehome_margin)
    return _POLICIES[name]()
