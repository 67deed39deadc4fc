"""Admit: per-tenant quotas, enforced through the store so every gateway process shares them.

Limits come from the tenant's settings (``gateway.tenants``). Rates are fixed one-minute
windows. A request in flight holds a lease of its tenant's slots (``store.ledger``), taken
on admission and released when the reply ends; this process renews its live leases while
their requests run (``LeaseKeeper``), so a slot outlives its process by at most one lease
period: the slots of a process that was killed, or could not reach the store to release
them, come back on their own. A request is checked twice, each time with one store call
and only for the limits the tenant has: before its body is read (requests per minute,
requests in flight), and before its history is stored (prompt tokens per minute,
sessions), so a refused request writes nothing. Upstream prompt tokens are only known after
a reply: they are added then, and a tenant whose window is used up is refused until the
window turns."""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.tenants import Tenants
from store import Charge, HeldLease, LeaseClaim, Refusal, SessionStore, StoreUnavailable

log = logging.getLogger("foldgate")

WINDOW_S = 60.0
# The lease pool of a tenant's requests in flight.
SLOTS = "concurrent"
# When a tenant is at its session limit nothing says when a session expires.
SESSION_RETRY_S = 60
# How long a tenant's requests hold their slots: the median of its last few here, for that
# many tenants at most (least recently released out).
HOLDS_PER_TENANT = 16
HOLD_TENANTS = 1024

_LIMITS = {
    "requests": "requests per minute",
    "raw_tokens": "prompt tokens per minute",
    "upstream_tokens": "upstream prompt tokens per minute",
    SLOTS: "concurrent requests",
    "sessions": "live sessions",
}


class QuotaExceeded(Exception):
    """The tenant is over one of its limits; ``retry_after_s`` says when to try again."""

    def __init__(self, tenant: str, refusal: Refusal, retry_after_s: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is at its limit of {refusal.limit} {_LIMITS[refusal.name]}; "
            f"retry after {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class LeaseKeeper:
    """This process's live leases, renewed all in one store call every third of a lease
    period while any are held (one task, which ends when none are left), and how long each
    tenant's requests have held theirs (``free_in_s``)."""

    def __init__(
        self, store: SessionStore, period_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"lease period must be positive, got {period_s}")
        self.store = store
        self.period_s = period_s
        self.clock = clock
        self.live: dict[HeldLease, float] = {}  # -> when it was taken
        self._holds: OrderedDict[str, deque[float]] = OrderedDict()  # tenant -> seconds
        self._renewing: asyncio.Task[None] | None = None
        self._emptied = asyncio.Event()

    def hold(self, lease: HeldLease) -> None:
        self.live[lease] = self.clock()
        self._emptied.clear()
        if self._renewing is None:
            self._renewing = asyncio.create_task(self._renew())

    async def release(self, lease: HeldLease) -> None:
        """Stop renewing the lease and give it back; if the store cannot be reached, it
        runs out on its own within one lease period."""
        taken = self.live.pop(lease, None)
        if taken is not None:
            self._held_for(lease.tenant, self.clock() - taken)
        if not self.live:
            self._emptied.set()
        try:
            await self.store.release_lease(lease)
        except StoreUnavailable as exc:
            log.warning(
                "slot of tenant %r not released (free within %g s): %s",
                lease.tenant,
                self.period_s,
                exc,
            )

    async def _renew(self) -> None:
        try:
            while self.live:
                try:
                    async with asyncio.timeout(self.period_s / 3):
                        await self._emptied.wait()
                except TimeoutError:
                    pass
                if not self.live:
                    break
                try:
                    lost = await self.store.renew_leases(list(self.live), self.period_s)
                except StoreUnavailable as exc:
                    log.warning("leases of requests in flight not renewed: %s", exc)
                    continue
                except Exception:  # the next round tries again; an ended task would not
                    log.exception("leases of requests in flight not renewed")
                    continue
                for lease in lost:
                    if lease in self.live:  # not released meanwhile: it ran out
                        log.warning("slot of tenant %r ran out in flight", lease.tenant)
                        del self.live[lease]
        finally:
            self._renewing = None

    def free_in_s(self, tenant: str, earliest_deadline_s: float) -> float:
        """Seconds until one of the tenant's slots is likely free, its pool being full and
        its earliest lease running out in ``earliest_deadline_s``. A lease still renewed
        does not run out: its slot comes back when its request ends. So: the first of the
        tenant's requests in flight here expected to end, taking each to hold its slot the
        median of the tenant's last holds (one already past it: about one more), or the
        earliest deadline when that comes first (a holder that died) or nothing says more
        (no request of the tenant ended here yet, or other processes hold its slots)."""
        holds = self._holds.get(tenant)
        if not holds:
            return earliest_deadline_s
        typical = statistics.median(holds)
        now = self.clock()
        ends = [
            typical - held if (held := now - taken) < typical else typical
            for lease, taken in self.live.items()
            if lease.tenant == tenant
        ]
        return min([earliest_deadline_s, *ends])

    def _held_for(self, tenant: str, seconds: float) -> None:
        holds = self._holds.get(tenant)
        if holds is None:
            holds = self._holds[tenant] = deque(maxlen=HOLDS_PER_TENANT)
        holds.append(seconds)
        self._holds.move_to_end(tenant)
        while len(self._holds) > HOLD_TENANTS:
            self._holds.popitem(last=False)


@dataclass
class Lease:
    """A request's slot among the tenant's requests in flight (a no-op without a limit)."""

    keeper: LeaseKeeper | None = None
    held: HeldLease | None = None
    released: bool = False

    async def release(self) -> None:
        if self.keeper is not None and self.held is not None and not self.released:
            self.released = True
            await self.keeper.release(self.held)


class Quotas:
    def __init__(
        self,
        store: SessionStore,
        tenants: Tenants,
        lease_period_s: float = GatewayConfig.lease_period_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.tenants = tenants
        self.leases = LeaseKeeper(store, lease_period_s, clock)

    async def admit(self, tenant: str) -> Lease:
        """Count the request and take a slot in flight; ``QuotaExceeded`` when over."""
        limits = self.tenants.settings(tenant)
        charges = []
        if limits.requests_per_minute is not None:
            charges.append(Charge("requests", 1, limits.requests_per_minute, WINDOW_S))
        if limits.concurrent_requests is None:
            await self._charge(tenant, charges)
            return Lease()
        held = HeldLease(tenant, SLOTS, uuid.uuid4().hex)
        claim = LeaseClaim(SLOTS, held.lease_id, limits.concurrent_requests, self.leases.period_s)
        await self._charge(tenant, charges, lease=claim)
        self.leases.hold(held)
        return Lease(self.leases, held)

    async def admit_prompt(self, tenant: str, session: str, raw_tokens: int) -> None:
        """Before the history is stored: prompt-token rates and the session count."""
        limits = self.tenants.settings(tenant)
        charges = []
        if limits.raw_tokens_per_minute is not None:
            charges.append(Charge("raw_tokens", raw_tokens, limits.raw_tokens_per_minute, WINDOW_S))
        if limits.upstream_tokens_per_minute is not None:
            charges.append(
                Charge("upstream_tokens", 0, limits.upstream_tokens_per_minute, WINDOW_S)
            )
        await self._charge(tenant, charges, session=session, max_sessions=limits.sessions)

    async def record_upstream(self, tenant: str, prompt_tokens: int) -> None:
        """Add the prompt tokens a replica reported to the tenant's window (if limited)."""
        if self.tenants.settings(tenant).upstream_tokens_per_minute is not None:
            await self.store.charge(
                tenant, [Charge("upstream_tokens", prompt_tokens, None, WINDOW_S)]
            )

    async def _charge(
        self,
        tenant: str,
        charges: list[Charge],
        *,
        session: str | None = None,
        max_sessions: int | None = None,
        lease: LeaseClaim | None = None,
    ) -> None:
        if not charges and max_sessions is None and lease is None:
            return
        refusal = await self.store.charge(
            tenant, charges, session=session, max_sessions=max_sessions, lease=lease
        )
        if refusal is None:
            return
        if refusal.name == "sessions":
            retry = SESSION_RETRY_S
        elif refusal.name == SLOTS:
            deadline = self.leases.period_s if refusal.free_in_s is None else refusal.free_in_s
            retry = max(1, math.ceil(self.leases.free_in_s(tenant, deadline)))
        else:
            retry = max(1, math.ceil(WINDOW_S - time.time() % WINDOW_S))
        raise QuotaExceeded(tenant, refusal, retry)
