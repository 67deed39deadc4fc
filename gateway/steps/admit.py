"""Admit: per-tenant quotas, enforced through the store so every gateway process shares them.

Limits come from the tenant's settings (``gateway.tenants``). Rates are fixed one-minute
windows; requests in flight are a gauge raised on admission and lowered when the reply
ends. A request is checked twice, each time with one store call and only for the limits
the tenant has: before its body is read (requests per minute, requests in flight), and
before its history is stored (prompt tokens per minute, sessions), so a refused request
writes nothing. Upstream prompt tokens are only known after a reply: they are added then,
and a tenant whose window is used up is refused until the window turns.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from gateway.tenants import Tenants
from store import Charge, Refusal, SessionStore, StoreUnavailable

log = logging.getLogger("foldgate")

WINDOW_S = 60.0
# When a tenant is at its in-flight or session limit nothing says when a slot frees up.
SLOT_RETRY_S = 1
SESSION_RETRY_S = 60

_LIMITS = {
    "requests": "requests per minute",
    "raw_tokens": "prompt tokens per minute",
    "upstream_tokens": "upstream prompt tokens per minute",
    "concurrent": "concurrent requests",
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


@dataclass
class Lease:
    """A request's slot among the tenant's requests in flight (a no-op without a limit)."""

    store: SessionStore | None
    tenant: str
    released: bool = False

    async def release(self) -> None:
        if self.store is not None and not self.released:
            self.released = True
            try:
                await self.store.charge(self.tenant, [Charge("concurrent", -1)])
            except StoreUnavailable as exc:
                # The gauge expires on its own (store.ledger.GAUGE_TTL_S).
                log.warning("slot of tenant %r not released: %s", self.tenant, exc)


class Quotas:
    def __init__(self, store: SessionStore, tenants: Tenants) -> None:
        self.store = store
        self.tenants = tenants

    async def admit(self, tenant: str) -> Lease:
        """Count the request and take a slot in flight; ``QuotaExceeded`` when over."""
        limits = self.tenants.settings(tenant)
        charges = []
        if limits.requests_per_minute is not None:
            charges.append(Charge("requests", 1, limits.requests_per_minute, WINDOW_S))
        if limits.concurrent_requests is not None:
            charges.append(Charge("concurrent", 1, limits.concurrent_requests))
        await self._charge(tenant, charges)
        return Lease(self.store if limits.concurrent_requests is not None else None, tenant)

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
    ) -> None:
        if not charges and max_sessions is None:
            return
        refusal = await self.store.charge(
            tenant, charges, session=session, max_sessions=max_sessions
        )
        if refusal is None:
            return
        if refusal.name == "sessions":
            retry = SESSION_RETRY_S
        elif refusal.name == "concurrent":
            retry = SLOT_RETRY_S
        else:
            retry = max(1, math.ceil(WINDOW_S - time.time() % WINDOW_S))
        raise QuotaExceeded(tenant, refusal, retry)
