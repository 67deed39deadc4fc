"""Working set: the request-path step where a session outside its replica's working set
waits at the gateway (``router.working_set`` decides; this step keeps the state and waits).

State, per replica: the sessions holding a share of its KV pool (``Member``: a request of
theirs runs there, or their pause reservation lasts), and one first-come-first-served
queue of waiting requests. A request whose session is in the set goes at once; any other
goes when it fits and nobody queued before it for that replica. Waiting is on an
``asyncio.Event`` per request, set when the set changes: a request of the replica ends, a
reservation ends (a timer at the earliest end), a waiter times out. Nobody starves: after
``admission_max_wait_s`` a request goes anyway (``timed_out``): refusing it would only make
an agent retry and lose its place, while the bound keeps the wait it adds known.

A request's pause (from the end of its session's previous request) joins the session's
history; when ``pause_reservation`` is on, the end of each request reserves the session's
footprint for ``router.working_set.reservation_s``. One gateway process sees its own
requests: several processes each keep their own sets (the replicas' scraped usage, which
all of them read, covers the others' running requests).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import metrics
from gateway.config import GatewayConfig
from gateway.lru import LRU
from router import ReplicaPool
from router.cost import CostModel
from router.working_set import (
    PAUSES_KEPT,
    Member,
    Room,
    admits,
    expected_pause_s,
    next_release,
    reservation_s,
)

# Sessions whose pause histories are kept (least recently used out first).
PAUSE_HISTORIES = 100_000
# The pause planned for before any session's pause was seen: agents' tool calls take
# seconds (the pressure profile's think time is drawn around a few).
PRIOR_PAUSE_S = 5.0
# Recent pauses of all sessions: a new session's prior.
GLOBAL_PAUSES_KEPT = 64


@dataclass(slots=True)
class Ticket:
    """One request's admission: where it was admitted (None: no replica's pool is known),
    how long it waited and why it went. ``finish`` it once its reply ended or failed."""

    key: str
    replica: str | None
    tokens: int
    wait_s: float = 0.0
    outcome: str = "admitted"
    done: bool = False


@dataclass(slots=True)
class _Waiter:
    key: str
    replica: str | None  # the session's replica; None: any
    tokens: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    admitted_to: str | None = None
    admitted: bool = False


@dataclass(slots=True)
class _Pauses:
    last_end: float | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=PAUSES_KEPT))


class WorkingSetGate:
    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        cost: CostModel,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.cost = cost
        self.clock = clock
        self.max_wait_s = config.admission_max_wait_s
        self.fraction = config.admission_kv_fraction
        self.pool_tokens = config.kv_pool_tokens
        self.reserve = config.pause_reservation
        self.reservation_max_s = config.reservation_max_s
        self.members: dict[str, dict[str, Member]] = {}
        self._queue: deque[_Waiter] = deque()
        self._pauses: LRU[_Pauses] = LRU(PAUSE_HISTORIES)
        self._recent: deque[float] = deque(maxlen=GLOBAL_PAUSES_KEPT)
        self._timer: asyncio.TimerHandle | None = None

    def room(self, url: str) -> Room | None:
        """The replica's pool (scraped ``vllm:cache_config_info``, else ``kv_pool_tokens``)
        and what its running requests use; None when its size is unknown."""
        replica = self.pool.get(url)
        scraped = replica.metrics if replica is not None else None
        pool_tokens = (scraped.kv_pool_tokens if scraped else None) or self.pool_tokens
        if not pool_tokens:
            return None
        usage = (scraped.kv_cache_usage if scraped else None) or 0.0
        return Room(pool_tokens, int(usage * pool_tokens))

    def holds(self, key: str, url: str) -> bool:
        """Whether the session is in the replica's working set now."""
        member = self.members.get(url, {}).get(key)
        return member is not None and member.holds(self.clock())

    async def admit(self, key: str, replica: str | None, tokens: int) -> Ticket:
        """Wait (at most ``admission_max_wait_s``) until the session may go to ``replica``
        (its assignment; None: wherever a pool has room), first come first served."""
        now = self.clock()
        self._arrived(key, now)
        goes, chosen = self._choose(key, replica, tokens, now, self._ahead(self._queue))
        if goes:
            self._hold(key, chosen, tokens)
            metrics.ADMISSION_WAIT_SECONDS.labels("admitted").observe(0.0)
            return Ticket(key, chosen, tokens)
        waiter = _Waiter(key, replica, tokens)
        self._queue.append(waiter)
        self._arm_timer()
        metrics.ADMISSION_WAITING.inc()
        outcome = "waited"
        try:
            await asyncio.wait_for(waiter.event.wait(), self.max_wait_s)
        except TimeoutError:
            if not waiter.admitted:  # else admitted as the timeout fired
                self._queue.remove(waiter)
                waiter.admitted_to = replica or self._roomiest(tokens)
                self._hold(key, waiter.admitted_to, tokens)
                outcome = "timed_out"
                self._wake()  # those queued behind it for that replica move up
        except BaseException:  # the client went away: give back what it was given
            if waiter.admitted:
                self._release(key, waiter.admitted_to)
            else:
                self._queue.remove(waiter)
            self._wake()
            raise
        finally:
            metrics.ADMISSION_WAITING.dec()
        waited = self.clock() - now
        metrics.ADMISSION_WAIT_SECONDS.labels(outcome).observe(waited)
        return Ticket(key, waiter.admitted_to, tokens, waited, outcome)

    def started(self, ticket: Ticket, url: str) -> None:
        """The replica that accepted the request: where the session's footprint is held
        (the policy may have placed a new session elsewhere than admission looked)."""
        if ticket.replica == url:
            return
        self._release(ticket.key, ticket.replica)
        self._hold(ticket.key, url, ticket.tokens)
        ticket.replica = url
        self._wake()

    def finish(self, ticket: Ticket, prompt_tokens: int | None, *, served: bool) -> None:
        """The request's reply ended (``served``) or it failed: its running share goes;
        a served one reserves the session's footprint through its pause
        (``pause_reservation``), sized by the prompt the replica reported."""
        if ticket.done:
            return
        ticket.done = True
        now = self.clock()
        if served:
            self._pauses_of(ticket.key).last_end = now
        url = ticket.replica
        members = self.members.get(url) if url is not None else None
        member = members.get(ticket.key) if members is not None else None
        if members is None or member is None:
            self._wake()
            return
        tokens = prompt_tokens or member.tokens
        until = member.reserved_until
        if served and self.reserve:
            expected = expected_pause_s(self._pauses_of(ticket.key).gaps, self._prior())
            held = reservation_s(expected, tokens, self.cost, self.reservation_max_s)
            until = max(until, now + held)
        updated = Member(tokens, max(0, member.running - 1), until)
        if updated.holds(now):
            members[ticket.key] = updated
        else:
            del members[ticket.key]
        self._wake()

    # -- the set and the queue ------------------------------------------------------------

    def _arrived(self, key: str, now: float) -> None:
        pauses = self._pauses_of(key)
        if pauses.last_end is not None:
            gap = max(0.0, now - pauses.last_end)
            pauses.gaps.append(gap)
            self._recent.append(gap)
            pauses.last_end = None

    def _pauses_of(self, key: str) -> _Pauses:
        pauses = self._pauses.get(key)
        if pauses is None:
            pauses = _Pauses()
            self._pauses.put(key, pauses)
        return pauses

    def _prior(self) -> float:
        return expected_pause_s(self._recent, PRIOR_PAUSE_S)

    @staticmethod
    def _ahead(waiters: deque[_Waiter] | list[_Waiter]) -> dict[str | None, int]:
        """Waiters queued, by the replica they wait for (None: any)."""
        counts: dict[str | None, int] = {}
        for w in waiters:
            counts[w.replica] = counts.get(w.replica, 0) + 1
        return counts

    def _choose(
        self, key: str, replica: str | None, tokens: int, now: float, ahead: dict[str | None, int]
    ) -> tuple[bool, str | None]:
        """Whether the request goes now, and to which replica's set (None: no pool is
        known, it goes as before). Requests waiting for a replica, and those waiting for
        any, are ahead of a newcomer for it."""
        urls = [replica] if replica is not None else [r.url for r in self.pool.routable()]
        best: tuple[int, str] | None = None
        for url in urls:
            room = self.room(url)
            if room is None:
                return True, None if replica is None else url
            queued = ahead.get(url, 0) + ahead.get(None, 0)
            members = self.members.get(url, {})
            if admits(room, members, key, tokens, now, fraction=self.fraction, queued_ahead=queued):
                free = room.pool_tokens - room.used_tokens
                if best is None or free > best[0]:
                    best = (free, url)
        if best is not None:
            return True, best[1]
        return not urls, None

    def _roomiest(self, tokens: int) -> str | None:
        rooms = [(r.url, self.room(r.url)) for r in self.pool.routable()]
        known = [(room.pool_tokens - room.used_tokens, url) for url, room in rooms if room]
        return max(known)[1] if known else None

    def _hold(self, key: str, url: str | None, tokens: int) -> None:
        if url is None:
            return
        for other, members in self.members.items():  # a session moved: its old share goes
            if other != url:
                members.pop(key, None)
        members = self.members.setdefault(url, {})
        old = members.get(key)
        members[key] = Member(
            max(tokens, old.tokens if old else 0),
            (old.running if old else 0) + 1,
            old.reserved_until if old else 0.0,
        )

    def _release(self, key: str, url: str | None) -> None:
        members = self.members.get(url) if url is not None else None
        member = members.get(key) if members is not None else None
        if members is None or member is None:
            return
        if member.running <= 1 and member.reserved_until <= self.clock():
            del members[key]
        else:
            members[key] = Member(member.tokens, max(0, member.running - 1), member.reserved_until)

    def _wake(self) -> None:
        """Admit, in arrival order, every waiter that fits now; then arm the timer for the
        next reservation to end."""
        now = self.clock()
        for members in self.members.values():  # idle past their reservation: released
            for key in [k for k, m in members.items() if not m.holds(now)]:
                del members[key]
        still: list[_Waiter] = []
        for waiter in list(self._queue):
            ahead = self._ahead(still)
            goes, chosen = self._choose(waiter.key, waiter.replica, waiter.tokens, now, ahead)
            if not goes:
                still.append(waiter)
                continue
            self._hold(waiter.key, chosen, waiter.tokens)
            waiter.admitted_to = chosen
            waiter.admitted = True
            waiter.event.set()
        self._queue = deque(still)
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._queue:
            return
        now = self.clock()
        ends = [e for m in self.members.values() if (e := next_release(m, now)) is not None]
        if ends:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, min(ends) - now), self._wake)
