"""Working set: the request-path step where a session outside its replica's working set
waits at the gateway. The decisions and their state are ``router.working_set_admission``'s
(the simulator runs the same object); this step asks it, and waits.

A request asks for its session's replica (its assignment), or, for a session without one,
for the routable replica with the most room beside its working set (as this gateway
counts it, the scrape's usage included; ties: the fewest members), where the policy then
routes it (``RouteHints.admitted``); a failover elsewhere moves its share (``started``).
Refused, it waits on an ``asyncio.Event`` that every change of the state sets (a request
admitted, a reply ended, a waiter gone) or until the admission's ``retry_at`` (a
reservation ending, its own deadline), then asks again; first come first served is the
admission's. After ``admission_max_wait_s`` it goes anyway
(``timed_out``): refusing it would only make an agent retry and lose its place, while the
bound keeps the wait it adds known. One gateway process sees its own requests: several
processes each keep their own sets (the replicas' scraped usage covers the others').
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway import metrics
from router import ReplicaPool
from router.admission_seam import AdmissionRequest, admission_request, relocate
from router.inputs import snapshot
from router.working_set_admission import WorkingSetAdmission


@dataclass(slots=True)
class Ticket:
    """One request's admission: the replica whose set it joined (None: no replica was
    routable), how long it waited and how it went. ``finish`` it once it ended."""

    request: AdmissionRequest | None
    wait_s: float = 0.0
    outcome: str = "admitted"
    done: bool = False


class WorkingSetGate:
    def __init__(
        self,
        admission: WorkingSetAdmission,
        pool: ReplicaPool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.pool = pool
        self.clock = clock
        self._changed = asyncio.Event()

    def holds(self, tenant: str, session: str, replica: str) -> bool:
        return self.admission.holds(tenant, session, replica, self.clock())

    def _request(
        self, tenant: str, session: str, replica: str | None, tokens: int, start: float
    ) -> AdmissionRequest | None:
        candidates = tuple(snapshot(r) for r in self.pool.routable())
        now = self.clock()
        return admission_request(
            tenant, session, replica, tokens, candidates, now=now, since=start,
            free=lambda c: self.admission.free_tokens(c, now),
        )  # fmt: skip

    async def admit(self, tenant: str, session: str, replica: str | None, tokens: int) -> Ticket:
        """Wait until the session may go to ``replica`` (its assignment; None: where the
        most KV is free), at most ``admission_max_wait_s``."""
        start = self.clock()
        waiting = False
        try:
            while True:
                request = self._request(tenant, session, replica, tokens, start)
                if request is None:
                    return Ticket(None)
                verdict = self.admission.decide(request)
                if verdict.admit:
                    break
                if not waiting:
                    waiting = True
                    metrics.ADMISSION_WAITING.inc()
                changed = self._changed
                timeout = max(0.0, (verdict.retry_at or request.now + 1.0) - request.now)
                # A timeout: a reservation ended, or the deadline came; ask again.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout)
        except BaseException:  # the client went away while it waited
            self.admission.withdrawn(tenant, session)
            self._notify()
            raise
        finally:
            if waiting:
                metrics.ADMISSION_WAITING.dec()
        self.admission.started(request)
        self._notify()
        metrics.ADMISSION_WAIT_SECONDS.labels(verdict.reason).observe(request.waited_s)
        return Ticket(request, request.waited_s, verdict.reason)

    def started(self, ticket: Ticket, url: str) -> None:
        """The replica that accepted the request, when the policy placed it elsewhere than
        admission looked: the session's share moves there."""
        request = ticket.request
        if request is None or request.replica == url:
            return
        ticket.request = relocate(self.admission, request, url, self.clock())
        self._notify()

    def finish(self, ticket: Ticket, *, served: bool) -> None:
        """The request's reply ended (``served``) or it failed: its running share goes; a
        served one reserves the session's footprint through its pause."""
        request = ticket.request
        if ticket.done or request is None:
            return
        ticket.done = True
        self.admission.ended(
            request.tenant, request.session, request.replica, self.clock(), served=served
        )
        self._notify()

    def _notify(self) -> None:
        """Wake every waiter to ask again (each keeps its place in the admission's queue)."""
        self._changed.set()
        self._changed = asyncio.Event()
