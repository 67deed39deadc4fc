"""Working-set admission at the routing seam (``router.admission_seam``): the state that
``router.working_set``'s pure decisions read, kept by the calls the gateway
(``gateway.steps.working_set``) and the simulator (``offline.sim.routing``) both make:
``decide`` for a routed request, ``started`` once it is sent, ``ended`` at its reply's end.
No clock is read: ``now`` comes in with every call.

State: per replica, the sessions holding a share of its pool (``Member``); the sessions
waiting, each with the replica it waits for and since when, in one queue per replica by
arrival (first come first served: a request waits behind every earlier one for its
replica, so only the first of a queue can go, and ``wake`` names only those to the
caller, which asks them again when the state changed); each session's recent pauses
(from a reply's end to its next request), which size its reservation. A request that has
waited ``admission_max_wait_s`` goes anyway (``timed_out``): nobody starves. A request
that goes without room (that one, or a member's whose prefix grew past it) takes the
reservations of the paused sessions whose blocks vLLM will evict for it (``revoked``), so
the set never counts more than the pool holds. With ``work_conserving`` the first waiter
also goes before that, when its wait costs more than going (``early_at``: the replica
idling through its members' pauses, their restores cheap), or once it has waited as long as
going costs: reason ``priced``. With
``price_fit`` restores and prefills are priced at what the replies' first tokens say an
uncached token costs now (``router.prefill_price``), not the cost model's fixed figure.
With ``growth_steps`` a session entering the set leaves room for that many steps of the
set's growth (``router.working_set.Headroom``), each session's growth its last step's.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Self

from router.admission_seam import AdmissionRequest, AdmissionVerdict, FirstToken
from router.cost import CostModel
from router.inputs import Candidate
from router.knobs import Knobs
from router.prefill_price import PrefillPrice
from router.working_set import (
    PAUSES_KEPT,
    Headroom,
    Member,
    Room,
    admits,
    early_at,
    expected_pause_s,
    next_release,
    occupied_tokens,
    reservation_s,
    revoked,
)

# The pause planned for before any session's pause was seen: agents' tool calls take
# seconds (the pressure profile's think time is drawn around a few).
PRIOR_PAUSE_S = 5.0
# Recent pauses of all sessions, a new session's prior; sessions whose history is kept.
GLOBAL_PAUSES_KEPT = 64
HISTORIES = 100_000

Key = tuple[str, str]  # (tenant, session)


@dataclass(slots=True)
class _History:
    """A session's recent pauses, its last prompt's size (what its next one grows from)
    and the replica that prompt ran on (where its prefix was left)."""

    last_end: float | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=PAUSES_KEPT))
    prompt_tokens: int = 0
    replica: str | None = None

    def left_on(self, url: str) -> int:
        """The tokens of its prefix it left on ``url`` (0 where it ran elsewhere)."""
        return self.prompt_tokens if self.replica == url else 0

    def growth(self, prompt_tokens: int) -> int:
        """What a prompt of ``prompt_tokens`` adds to the last one (0 for a first)."""
        return max(0, prompt_tokens - self.prompt_tokens) if self.prompt_tokens else 0


class WorkingSetAdmission:
    def __init__(
        self,
        cost: CostModel,
        *,
        fraction: float = 0.9,
        max_wait_s: float = 5.0,
        reserve: bool = True,
        reservation_max_s: float = 120.0,
        pool_tokens: int | None = None,
        work_conserving: bool = True,
        price_fit: bool = False,
        growth_steps: int = 0,
    ) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"admission_kv_fraction must be in (0, 1], got {fraction}")
        if max_wait_s < 0 or reservation_max_s < 0:
            raise ValueError("admission_max_wait_s and reservation_max_s must be >= 0")
        if growth_steps < 0:
            raise ValueError(f"admission_growth_steps must be >= 0, got {growth_steps}")
        self.base_cost = cost
        self.cost = cost  # at the fitted prefill price, with ``price_fit``
        self.price = PrefillPrice(cost.per_prefill_token_s) if price_fit else None
        self.fraction = fraction
        self.max_wait_s = max_wait_s
        self.reserve = reserve
        self.reservation_max_s = reservation_max_s
        self.pool_tokens = pool_tokens  # where a replica's scrape has none
        self.work_conserving = work_conserving
        self.growth_steps = growth_steps
        self.members: dict[str, dict[Key, Member]] = {}
        self.waiting: dict[Key, tuple[str, float]] = {}  # -> (replica, since), arrival order
        # Per replica, its waiters by (since, arrival number); the arrival numbers; the
        # waiters whose replica is chosen by room (``AdmissionRequest.roaming``).
        self._queues: dict[str, list[tuple[float, int, Key]]] = {}
        self._arrival: dict[Key, int] = {}
        self._roaming: set[Key] = set()
        self._arrivals = itertools.count()
        self._histories: OrderedDict[Key, _History] = OrderedDict()
        self._recent: deque[float] = deque(maxlen=GLOBAL_PAUSES_KEPT)

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(
            knobs.cost_model(),
            fraction=knobs.admission_kv_fraction,
            max_wait_s=knobs.admission_max_wait_s,
            reserve=knobs.pause_reservation,
            reservation_max_s=knobs.reservation_max_s,
            work_conserving=knobs.admission_work_conserving,
            price_fit=knobs.admission_price_fit,
            growth_steps=knobs.admission_growth_steps,
        )

    def room(self, candidate: Candidate | None) -> Room | None:
        """A replica's pool (its scrape's, else the configured or the cost model's) and what
        its running requests use."""
        scraped = candidate.kv_pool_tokens if candidate is not None else None
        pool = scraped or self.pool_tokens or self.cost.kv_pool_tokens
        usage = (candidate.kv_usage if candidate is not None else None) or 0.0
        return Room(pool, int(usage * pool)) if pool else None

    def free_tokens(self, candidate: Candidate, now: float) -> tuple[int, int]:
        """What the replica's pool has beside its working set, and minus its members: a
        new session goes where this is most (it evicts the least there)."""
        room = self.room(candidate)
        holding = [m for m in self.members.get(candidate.url, {}).values() if m.holds(now)]
        if room is None:
            return 0, -len(holding)
        return room.pool_tokens - occupied_tokens(room, holding, now), -len(holding)

    def describe(self, url: str, now: float) -> dict[str, object]:
        """The replica's state as a decision there reads it, for a trace: its members
        (tokens, running requests, seconds left of their reservations), its queue in order
        (each waiter's seconds waited) and the sessions waiting by room."""
        members = {
            "/".join(k): [m.tokens, m.running, round(max(0.0, m.reserved_until - now), 3)]
            for k, m in self.members.get(url, {}).items()
            if m.holds(now)
        }
        queue = [["/".join(k), round(now - since, 3)] for since, _, k in self._queues.get(url, [])]
        roaming = sorted("/".join(k) for k in self._roaming)
        return {"members": members, "queue": queue, "roaming": roaming}

    def holds(self, tenant: str, session: str, replica: str, now: float) -> bool:
        """Whether the session is in the replica's working set."""
        member = self.members.get(replica, {}).get((tenant, session))
        return member is not None and member.holds(now)

    def decide(self, request: AdmissionRequest) -> AdmissionVerdict:
        key = (request.tenant, request.session)
        now = request.now
        if key not in self.waiting:
            self._arrived(key, now)
        url = request.replica
        candidate = next((c for c in request.candidates if c.url == url), None)
        room = self.room(candidate)
        members = self.members.get(url, {})
        since = self.waiting.get(key, (url, now))[1]
        ahead = self._ahead(url, since)
        headroom = self._headroom(key, request.prompt_tokens)
        if room is None or admits(
            room, members, key, request.prompt_tokens, now,
            fraction=self.fraction, queued_ahead=ahead, headroom=headroom,
        ):  # fmt: skip
            waited = self._leave(key)
            if room is not None:  # a member whose prefix grew past the room
                self._revoke(room, members, key, request.prompt_tokens, now)
            return AdmissionVerdict(True, "waited" if waited else "admitted")
        if request.waited_s >= self.max_wait_s:
            self._leave(key)
            self._revoke(room, members, key, request.prompt_tokens, now)
            return AdmissionVerdict(True, "timed_out")
        goes_at = None
        if self.work_conserving and ahead == 0:
            goes_at = self._early(request, candidate, room, members, headroom)
        if goes_at is not None and goes_at <= now:
            self._leave(key)
            self._revoke(room, members, key, request.prompt_tokens, now)
            return AdmissionVerdict(True, "priced")
        self._wait(key, url, since, roaming=request.roaming)
        deadline = now + self.max_wait_s - request.waited_s
        asks = (deadline, next_release(members, now), goes_at)
        return AdmissionVerdict(False, "waiting", min(t for t in asks if t is not None))

    def started(self, request: AdmissionRequest) -> None:
        key = (request.tenant, request.session)
        self._leave(key)
        for url, members in self.members.items():  # a session moved: its old share goes
            if url != request.replica:
                members.pop(key, None)
        members = self.members.setdefault(request.replica, {})
        old = members.get(key)
        history = self._history_of(key)
        growth = history.growth(request.prompt_tokens)
        history.prompt_tokens, history.replica = request.prompt_tokens, request.replica
        # Its tokens: this prompt (the session's prefix grows); its reservation is over, it
        # is back (the next reply's end sets the next one).
        running = (old.running if old else 0) + 1
        members[key] = Member(request.prompt_tokens, running, 0.0, growth=growth)

    def ended(
        self,
        tenant: str,
        session: str,
        replica: str,
        now: float,
        *,
        served: bool = True,
        first_token: FirstToken | None = None,
        pausing: bool = True,
    ) -> None:
        """A reply of the session on ``replica`` ended (``served``: it was answered, so the
        session pauses now and its footprint is reserved through the pause);
        ``first_token`` feeds the prefill price. Not ``pausing`` (the reply ended the
        agent's turn: no tool call to run), nothing is reserved and the gap to the
        session's next request, a person's or none, sizes no later pause."""
        if first_token is not None and self.price is not None:
            self.price.observe(*first_token)
            if self.price.fitted:
                self.cost = replace(self.base_cost, per_prefill_token_s=self.price.per_token_s)
        key = (tenant, session)
        members = self.members.get(replica, {})
        member = members.get(key)
        if served:
            self._history_of(key).last_end = now if pausing else None
        if member is not None:
            until = member.reserved_until
            if served and member.running == 1:  # its last request ended
                until = 0.0
                if self.reserve and pausing:
                    expected = expected_pause_s(self._history_of(key).gaps, self._prior())
                    hold = reservation_s(expected, member.tokens, self.cost, self.reservation_max_s)
                    until = now + hold
            updated = replace(
                member, running=max(0, member.running - 1), reserved_until=until, ended_at=now
            )
            if updated.holds(now):
                members[key] = updated
            else:
                del members[key]
        self._expire(now)

    def _early(
        self,
        request: AdmissionRequest,
        candidate: Candidate | None,
        room: Room,
        members: dict[Key, Member],
        headroom: Headroom | None,
    ) -> float:
        """``early_at`` for a waiter first in its queue: the replica's requests are the
        most of its scrape (running and waiting), this gateway's in flight there, and its
        running members."""
        counted = [sum(m.running for m in members.values())]
        if candidate is not None:
            counted += [candidate.running + candidate.waiting, candidate.in_flight]
        deadline = request.now + self.max_wait_s - request.waited_s
        key = (request.tenant, request.session)
        return early_at(
            room, members, key, request.prompt_tokens, request.now, fraction=self.fraction,
            cost=self.cost, running=math.ceil(max(counted)), deadline=deadline,
            waited_s=request.waited_s, headroom=headroom,
            own_tokens=self._history_of(key).left_on(request.replica),
        )  # fmt: skip

    def _headroom(self, key: Key, prompt_tokens: int) -> Headroom | None:
        """The room an entrant leaves for the set's growth (``growth_steps`` of it), its own
        growth this step's."""
        if not self.growth_steps:
            return None
        return Headroom(self.growth_steps, self._history_of(key).growth(prompt_tokens))

    def _revoke(
        self, room: Room, members: dict[Key, Member], key: Key, tokens: int, now: float
    ) -> None:
        """A request goes without room (a member whose prefix grew, or one past the bound):
        the paused sessions vLLM will evict for it leave the set (they wait when they are
        back), so the set stays what the pool holds."""
        for gone in revoked(room, members, key, tokens, now, fraction=self.fraction):
            del members[gone]

    def withdrawn(self, tenant: str, session: str) -> None:
        """A waiting request went away (its client left) before it was admitted."""
        self._leave((tenant, session))

    def wake(self, ask: Callable[[Key], object]) -> None:
        """The state changed: ``ask`` (the caller asks ``decide`` again for that waiter)
        each waiter that may go now, in arrival order: the first of each replica's queue
        (all the first if several came at one instant) and every waiter whose replica is
        chosen by room (it may choose another now). Any other is refused while an earlier
        one waits for its replica; one that becomes first during the pass (the one before
        it went, or moved) is asked in it, after those before it, as asking every waiter in
        arrival order would. Each waiter is asked at most once a pass; its own ``retry_at``
        (a reservation ending, its deadline) is the caller's to keep."""
        pending = [(self._arrival[k], k) for k in self._roaming]
        for queue in self._queues.values():
            pending += self._firsts(queue)
        heapq.heapify(pending)
        asked: set[Key] = set()
        while pending:
            number, key = heapq.heappop(pending)
            if key in asked or key not in self.waiting:
                continue
            asked.add(key)
            url = self.waiting[key][0]
            ask(key)
            if self.waiting.get(key, (None,))[0] != url:  # it went, or waits elsewhere now
                for first in self._firsts(self._queues.get(url, [])):
                    if first[0] > number:
                        heapq.heappush(pending, first)

    def _ahead(self, url: str, since: float) -> int:
        """Whether a request that has waited since ``since`` has anyone before it in the
        replica's queue (1) or not (0)."""
        queue = self._queues.get(url)
        return 1 if queue and queue[0][0] < since else 0

    @staticmethod
    def _firsts(queue: list[tuple[float, int, Key]]) -> list[tuple[int, Key]]:
        """A queue's first waiters: those that came at its earliest instant."""
        if not queue:
            return []
        earliest = queue[0][0]
        return [(n, k) for t, n, k in itertools.takewhile(lambda e: e[0] == earliest, queue)]

    def _wait(self, key: Key, url: str, since: float, *, roaming: bool) -> None:
        """The request of ``key`` waits for ``url`` (it keeps its place by ``since``)."""
        if roaming:
            self._roaming.add(key)
        else:
            self._roaming.discard(key)
        old = self.waiting.get(key)
        if old == (url, since):
            return
        if old is not None:
            self._dequeue(key, *old)
        number = self._arrival.setdefault(key, next(self._arrivals))
        self.waiting[key] = (url, since)
        bisect.insort(self._queues.setdefault(url, []), (since, number, key))

    def _leave(self, key: Key) -> bool:
        """``key`` waits no more; whether it was waiting."""
        self._roaming.discard(key)
        old = self.waiting.pop(key, None)
        if old is None:
            return False
        self._dequeue(key, *old)
        del self._arrival[key]
        return True

    def _dequeue(self, key: Key, url: str, since: float) -> None:
        queue = self._queues[url]
        entry = (since, self._arrival[key], key)
        del queue[bisect.bisect_left(queue, entry)]
        if not queue:
            del self._queues[url]

    def _expire(self, now: float) -> None:
        for members in self.members.values():
            for key in [k for k, m in members.items() if not m.holds(now)]:
                del members[key]

    def _arrived(self, key: Key, now: float) -> None:
        history = self._history_of(key)
        if history.last_end is not None:
            gap = max(0.0, now - history.last_end)
            history.gaps.append(gap)
            self._recent.append(gap)
            history.last_end = None

    def _history_of(self, key: Key) -> _History:
        history = self._histories.pop(key, None) or _History()
        self._histories[key] = history  # most recently used last
        while len(self._histories) > HISTORIES:
            self._histories.popitem(last=False)
        return history

    def _prior(self) -> float:
        return expected_pause_s(self._recent, PRIOR_PAUSE_S)
