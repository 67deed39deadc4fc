"""Working set: the request-path step where a session outside its replica's working set
waits at the gateway. The decisions and their state are ``router.working_set_admission``'s
(the simulator runs the same object); this step asks it, and waits.

A request asks for its session's replica (its assignment), or, for a session without one,
for the routable replica with the most room beside its working set (as this gateway
counts it, the scrape's usage included; ties: the fewest members), where the policy then
routes it (``RouteHints.admitted``); a failover elsewhere moves its share (``started``).
Refused, it waits until the admission's ``retry_at`` (a reservation ending, its own
deadline), then asks again; and at every change of the state (a request admitted, a reply
ended, a waiter gone) the gate asks again for the waiters the admission names
(``WorkingSetAdmission.wake``: the first waiting for each replica, those whose replica is
chosen by room), not for every waiter, each of which would count its queue: first come
first served is the admission's. After ``admission_max_wait_s`` it goes anyway
(``timed_out``): refusing it would only make an agent retry and lose its place, while the
bound keeps the wait it adds known. One gateway process sees its own requests: several
processes each keep their own sets (the replicas' scraped usage covers the others').
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import metrics
from gateway.steps.admission_trace import AdmissionTrace
from router import ReplicaPool
from router.admission_seam import (
    AdmissionRequest,
    AdmissionVerdict,
    FirstToken,
    admission_request,
    relocate,
)
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


@dataclass(slots=True, eq=False)
class _Waiter:
    """A request waiting at the gate: what it asks with, when its own timer asks again,
    and, once its wait is over, the request admitted (None: no replica was routable) and
    the verdict. ``changed`` is set when either changes."""

    tenant: str
    session: str
    replica: str | None
    tokens: int
    start: float
    retry_at: float
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: tuple[AdmissionRequest | None, AdmissionVerdict] | None = None


class WorkingSetGate:
    def __init__(
        self,
        admission: WorkingSetAdmission,
        pool: ReplicaPool,
        clock: Callable[[], float] = time.monotonic,
        trace: AdmissionTrace | None = None,
    ) -> None:
        self.admission = admission
        self.pool = pool
        self.clock = clock
        self.trace = trace
        self._waiters: dict[tuple[str, str], list[_Waiter]] = {}  # a session's, in order

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
        request = self._request(tenant, session, replica, tokens, start)
        if request is None:
            return Ticket(None)
        verdict = self._decide(request, "arrived")
        if verdict.admit:
            self.admission.started(request)
            self._notify()
        else:
            waiter = _Waiter(
                tenant, session, replica, tokens, start, _retry_at(verdict, request.now)
            )
            waited = await self._wait(waiter)
            if waited[0] is None:
                return Ticket(None)
            request, verdict = waited  # type: ignore[assignment]
        metrics.ADMISSION_WAIT_SECONDS.labels(verdict.reason).observe(request.waited_s)
        return Ticket(request, request.waited_s, verdict.reason)

    async def _wait(self, waiter: _Waiter) -> tuple[AdmissionRequest | None, AdmissionVerdict]:
        key = (waiter.tenant, waiter.session)
        self._waiters.setdefault(key, []).append(waiter)
        metrics.ADMISSION_WAITING.inc()
        try:
            while waiter.done is None:
                waiter.changed.clear()
                timeout = max(0.0, waiter.retry_at - self.clock())
                try:
                    await asyncio.wait_for(waiter.changed.wait(), timeout)
                except TimeoutError:  # a reservation ended, or the deadline came
                    # A wake may have let it go in the same turn of the loop as its timer
                    # came due (wait_for then raises all the same): asked again, it would
                    # start a second share that no reply ends, holding its room for good.
                    if waiter.done is None and self._ask(waiter, "timer"):
                        self._notify()
            return waiter.done
        except BaseException:  # the client went away while it waited
            if waiter.done is None:
                self._drop(waiter)
                self._withdrawn(waiter.tenant, waiter.session, "client gone")
            elif waiter.done[0] is not None:  # admitted meanwhile, never sent
                self._ended(waiter.done[0], served=False)
            self._notify()
            raise
        finally:
            metrics.ADMISSION_WAITING.dec()

    def _ask(self, waiter: _Waiter, because: str) -> bool:
        """Ask again for a waiting request: admitted (its share starts) or no replica
        routable, its wait is over (True); refused, its timer moves to the new verdict's."""
        request = self._request(
            waiter.tenant, waiter.session, waiter.replica, waiter.tokens, waiter.start
        )
        if request is None:
            self._withdrawn(waiter.tenant, waiter.session, "no replica routable")
            waiter.done = (None, AdmissionVerdict(True))
        else:
            verdict = self._decide(request, because)
            if not verdict.admit:
                waiter.retry_at = _retry_at(verdict, request.now)
                waiter.changed.set()
                return False
            self.admission.started(request)
            waiter.done = (request, verdict)
        self._drop(waiter)
        waiter.changed.set()
        return True

    def _drop(self, waiter: _Waiter) -> None:
        key = (waiter.tenant, waiter.session)
        waiters = self._waiters.get(key, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiters.pop(key, None)

    def _ask_session(self, key: tuple[str, str]) -> None:
        """Ask for the session's waiting requests in order while they are admitted (after
        the first, the session is a member: any other of its requests goes too)."""
        waiters = self._waiters.get(key)
        if not waiters:  # nobody waits for this entry any more
            self._withdrawn(*key, "no request waits")
            return
        for waiter in list(waiters):
            if not self._ask(waiter, "changed"):
                return

    def started(self, ticket: Ticket, url: str) -> None:
        """The replica that accepted the request, when the policy placed it elsewhere than
        admission looked: the session's share moves there."""
        request = ticket.request
        if request is None or request.replica == url:
            return
        ticket.request = relocate(self.admission, request, url, self.clock())
        if self.trace is not None:
            self.trace.write("moved", request.tenant, request.session, url, left=request.replica)
        self._notify()

    def finish(
        self,
        ticket: Ticket,
        *,
        served: bool,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        """The request's reply ended (``served``) or it failed: its running share goes; a
        served one reserves the session's footprint through its pause unless it ended the
        agent's turn (``pausing`` False), and its ``first_token`` feeds the admission's
        prefill price."""
        request = ticket.request
        if ticket.done or request is None:
            return
        ticket.done = True
        self._ended(request, served=served, first_token=first_token, pausing=pausing)
        metrics.ADMISSION_PREFILL_PRICE.set(self.admission.cost.per_prefill_token_s)
        self._notify()

    def _decide(self, request: AdmissionRequest, because: str) -> AdmissionVerdict:
        verdict = self.admission.decide(request)
        if self.trace is not None:
            candidate = next((c for c in request.candidates if c.url == request.replica), None)
            room = self.admission.room(candidate)
            retry = verdict.retry_at
            self.trace.write(
                "decide", request.tenant, request.session, request.replica, because=because,
                verdict=verdict.reason, tokens=request.prompt_tokens,
                waited_s=round(request.waited_s, 3),
                retry_in_s=None if retry is None else round(retry - request.now, 3),
                room=None if room is None else [room.pool_tokens, room.used_tokens],
            )  # fmt: skip
        return verdict

    def _ended(
        self,
        request: AdmissionRequest,
        *,
        served: bool,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        self.admission.ended(
            request.tenant, request.session, request.replica, self.clock(),
            served=served, first_token=first_token, pausing=pausing,
        )  # fmt: skip
        if self.trace is not None:
            self.trace.write(
                "ended", request.tenant, request.session, request.replica, served=served,
                pausing=pausing,
            )  # fmt: skip

    def _withdrawn(self, tenant: str, session: str, why: str) -> None:
        self.admission.withdrawn(tenant, session)
        if self.trace is not None:
            self.trace.write("withdrawn", tenant, session, None, why=why)

    def _notify(self) -> None:
        """The state changed: ask again for the waiters that may go now, as the admission
        names them (each keeps its place in its queue)."""
        if self._waiters:
            self.admission.wake(self._ask_session)


def _retry_at(verdict: AdmissionVerdict, now: float) -> float:
    return verdict.retry_at if verdict.retry_at is not None else now + 1.0
