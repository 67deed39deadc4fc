"""The ledger contract: counters and request logs per branch and tenant, and quota charges.

- Counters: named integers per branch and per tenant, changed only by atomic increments
  (``add_counts``), so concurrent requests never lose one another's counts. A call carries
  a token of its own (the request id): repeating it (a retry after a lost reply) adds
  nothing, while two different calls with equal counts both add. The same call may append
  one record to the branch's request log (``get_log``), under the same token.
- Quota charges (``charge``): per-tenant counters in fixed time windows (or gauges),
  checked against their limits and added all together or not at all, so every gateway
  process sharing the store enforces one limit.
- Leases (``charge(lease=...)``, ``renew_leases``, ``release_lease``): at most ``limit``
  holders at once of a tenant's pool (such as requests in flight), each lease an id with a
  deadline. A lease not renewed before its deadline is gone, so the slots of a process that
  died (or could not reach the store to release) come back within one lease period; a
  refused claim says when the earliest lease runs out (``Refusal.free_in_s``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from store.checks import check_branch, check_counts, check_id, check_lease_period

# How long a counting token is remembered: a retry arrives within seconds, never an hour.
COUNT_TOKEN_TTL_S = 3600.0
# A gauge (a charge without a window) expires this long after its last change. (Requests in
# flight are leases now, which expire on their own: a gauge a crashed process left raised
# was taken for up to this long, forever under steady traffic.)
GAUGE_TTL_S = 900.0


@dataclass(frozen=True, slots=True)
class Charge:
    """Add ``amount`` to the tenant's counter ``name`` unless that passes ``limit``.

    ``window_s``: the counter restarts every ``window_s`` seconds (fixed windows aligned to
    the epoch); None: a gauge that is raised and lowered (``amount`` may be negative).
    ``limit`` None only counts. A charge of 0 with a limit checks the counter is below it.
    """

    name: str
    amount: int
    limit: int | None = None
    window_s: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """Take lease ``lease_id`` of the tenant's pool ``name`` unless ``limit`` leases of it
    are held, for ``period_s`` seconds (then gone unless ``renew_leases`` pushes it on)."""

    name: str
    lease_id: str
    limit: int
    period_s: float


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease taken by ``charge``: its tenant, pool and id."""

    tenant: str
    name: str
    lease_id: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why ``charge`` added nothing: the counter (``"sessions"``, or a lease pool) and its
    value. ``free_in_s``, for a lease pool: seconds until its earliest lease runs out."""

    name: str
    current: int
    limit: int
    free_in_s: float | None = None


def window_key(charge: Charge, now: float) -> tuple[str, float]:
    """The stored counter name of a charge at time ``now`` and how long to keep it."""
    if charge.window_s is None:
        return charge.name, GAUGE_TTL_S
    return f"{charge.name}@{int(now // charge.window_s)}", 2 * charge.window_s


def over_limit(current: int, charge: Charge) -> bool:
    return charge.limit is not None and current + max(charge.amount, 1) > charge.limit


class Ledger(ABC):
    """Counters, request logs, quota charges and leases. The public methods check their
    arguments, then call the backend's hooks (``record_counts``, ``read_log``,
    ``read_counts``, ``read_tenant_counts``, ``take_charges``, ``extend_leases``,
    ``drop_lease``)."""

    async def add_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        *,
        token: str,
        latest: Mapping[str, int] | None = None,
        record: bytes | None = None,
    ) -> None:
        """Add ``counts`` to the branch's counters and to the tenant's, by atomic increments.

        ``token`` names this call (a request id): a repeated call with the same token adds
        nothing. ``latest``: branch values that are set, not added (what the last request
        saw, e.g. its prompt size); the tenant's counters do not take them. ``record``:
        appended to the branch's request log. A branch that no longer exists (session
        deleted or expired) gets nothing; the tenant's counters are added all the same.
        Adding 0 writes nothing: a counter never added to reads as absent, which readers
        take as 0 (most of a request's counters add 0: restores, retries, folds).
        """
        check_id("tenant", tenant)
        check_id("session", session)
        check_branch(branch)
        latest = latest or {}
        check_counts(counts, token, latest)
        added = {name: value for name, value in counts.items() if value}
        await self.record_counts(tenant, session, branch, added, token, latest, record)

    async def get_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        """The branch's request log (``add_counts`` records) in order; ``NotFound`` if absent."""
        check_id("tenant", tenant)
        check_id("session", session)
        return await self.read_log(tenant, session, check_branch(branch))

    async def get_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        """The branch's counters (empty when never counted); ``NotFound`` if absent."""
        check_id("tenant", tenant)
        check_id("session", session)
        return await self.read_counts(tenant, session, check_branch(branch))

    async def get_tenant_counts(self, tenant: str) -> dict[str, int]:
        """The tenant's counters, summed over all its sessions ever counted."""
        return await self.read_tenant_counts(check_id("tenant", tenant))

    async def charge(
        self,
        tenant: str,
        charges: Sequence[Charge],
        *,
        session: str | None = None,
        max_sessions: int | None = None,
        lease: LeaseClaim | None = None,
    ) -> Refusal | None:
        """Add every charge, or none when one would pass its limit (that one is returned).

        With ``session`` and ``max_sessions``: also refused (as ``"sessions"``) when the
        session is not live yet and the tenant already has ``max_sessions`` live sessions.
        With ``lease``: also refused (as the lease's pool, with ``free_in_s``) when the pool
        already holds ``lease.limit`` live leases, else the lease is taken with the charges
        (claiming a lease the pool holds already only renews it). Leases past their
        deadline are dropped first.
        """
        check_id("tenant", tenant)
        if session is not None:
            check_id("session", session)
        for c in charges:
            check_id("charge", c.name)
            if c.window_s is not None and c.window_s <= 0:
                raise ValueError(f"charge window must be positive, got {c.window_s}")
        if lease is not None:
            check_id("lease pool", lease.name)
            check_id("lease id", lease.lease_id)
            check_lease_period(lease.period_s)
            if lease.limit < 1:
                raise ValueError(f"lease limit must be at least 1, got {lease.limit}")
        return await self.take_charges(tenant, charges, session, max_sessions, lease)

    async def renew_leases(self, leases: Sequence[HeldLease], period_s: float) -> list[HeldLease]:
        """Push the deadline of each lease still held to ``period_s`` from now, all in one
        call (any tenants); returns those no longer held (released, or past their deadline:
        their slots may have gone to others, and they stay gone)."""
        for held in leases:
            check_held(held)
        check_lease_period(period_s)
        if not leases:
            return []
        return await self.extend_leases(leases, period_s)

    async def release_lease(self, lease: HeldLease) -> None:
        """Give the lease's slot back; releasing a lease not held (again, or after its
        deadline) does nothing."""
        await self.drop_lease(check_held(lease))

    @abstractmethod
    async def record_counts(
        self,
        tenant: str,
        session: str,
        branch: int,
        counts: Mapping[str, int],
        token: str,
        latest: Mapping[str, int],
        record: bytes | None,
    ) -> None:
        """``add_counts`` with checked arguments, atomically and once per token."""

    @abstractmethod
    async def read_log(self, tenant: str, session: str, branch: int) -> list[bytes]:
        """``get_log`` with checked arguments."""

    @abstractmethod
    async def read_counts(self, tenant: str, session: str, branch: int) -> dict[str, int]:
        """``get_counts`` with checked arguments."""

    @abstractmethod
    async def read_tenant_counts(self, tenant: str) -> dict[str, int]:
        """``get_tenant_counts`` with a checked tenant."""

    @abstractmethod
    async def take_charges(
        self,
        tenant: str,
        charges: Sequence[Charge],
        session: str | None,
        max_sessions: int | None,
        lease: LeaseClaim | None,
    ) -> Refusal | None:
        """``charge`` with checked arguments: all charges (and the lease) or none,
        atomically."""

    @abstractmethod
    async def extend_leases(self, leases: Sequence[HeldLease], period_s: float) -> list[HeldLease]:
        """``renew_leases`` with checked, non-empty arguments."""

    @abstractmethod
    async def drop_lease(self, lease: HeldLease) -> None:
        """``release_lease`` with a checked lease."""


def check_held(lease: HeldLease) -> HeldLease:
    check_id("tenant", lease.tenant)
    check_id("lease pool", lease.name)
    check_id("lease id", lease.lease_id)
    return lease
