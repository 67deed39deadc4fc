"""Routing policies built from llm-d-style parts: filters, scorers and a picker.

Every request is routed in three steps, as llm-d's endpoint picker does: filters drop the
replicas that cannot serve it (down, already tried by failover), scorers give every
remaining replica a number (higher is better), and a picker takes one. The parts are pure:
they see a snapshot of the request (`RouteContext`) and of each replica (`Candidate`) and
do no I/O and read no clock. The policy around them reads and writes what it must (the
session -> replica assignment in the shared store) and builds the snapshots.

llm-d normalises every score to [0, 1] and adds them with weights. The cost-aware sticky
policy cannot price a move that way (a normalised queue and a normalised cache hit are not
the same currency), so its scorers all speak seconds of expected delay saved: waiting in a
queue costs seconds, re-prefilling a prefix that is cached elsewhere costs seconds, and the
sum is a like-for-like comparison.

Policies (config names):

- ``round_robin``: no scorers; the picker rotates over the candidates.
- ``least_loaded``: the load scorer (scraped running + waiting plus this gateway's in-flight
  requests); lowest load wins, ties rotate.
- ``sticky``: the load scorer plus an affinity scorer that gives the session's assigned
  replica a bonus of ``rehome_margin`` requests, then the assignment write. A session moves
  only when its replica is unusable or busier than the least-loaded one by more than the
  margin, whatever its cached prefix is worth.
- ``sticky_cost``: prices a move. Queue wait (from scraped waiting/running and KV usage)
  against re-prefilling the session's cached prefix elsewhere (its size from the store's
  per-session accounting, passed in `RouteHints`; prefill speed from a `CostModel`), plus
  a prefix scorer for replicas holding the same agent's system prompt or a forked session's
  parent; a move must win by a hysteresis margin. New sessions go where they fit best: among
  replicas whose queue wait is near the shortest, the most free KV and fewest bound sessions.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.assignments import AssignmentStore
from router.cost import CostModel
from router.pool import ReplicaPool
from router.replica import Replica
from router.telemetry import ROUTING_DECISIONS, SESSION_MOVES

log = logging.getLogger(__name__)


class NoHealthyReplica(RuntimeError):
    """Every replica is down or already tried for this request; ``retry_after_s``: when one
    may be routable again (``ReplicaPool.retry_after_s``)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Decision:
    replica: Replica
    reason: str
    # The replica URL the session was assigned to before this decision moved it, if it moved.
    moved_from: str | None = None


@dataclass(frozen=True, slots=True)
class RouteHints:
    """What the gateway knows about a request beyond its session id.

    ``prompt_tokens``: the rendered prompt's tokens. ``cached_prefix_tokens``: how much of
    the session's prompt its replica holds, from the store's per-session accounting (the
    previous request's prompt); None when unknown. ``prefix_key``: names a prefix other
    sessions share (a digest of tenant, tools and system prompt: the same agent), of
    ``prefix_tokens`` tokens. ``parent_session``: the session this one was forked from.
    ``assignment_read``: the caller read the session's assignment (``assignment``) with its
    own store read and writes the chosen replica back with its own store write, so a sticky
    policy neither reads nor writes it (the gateway shares those round trips with the
    session's history).
    """

    prompt_tokens: int = 0
    cached_prefix_tokens: int | None = None
    prefix_key: str | None = None
    prefix_tokens: int = 0
    parent_session: str | None = None
    assignment: str | None = None
    assignment_read: bool = False


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica as the scorers see it: a snapshot, not the live object."""

    url: str
    running: float
    waiting: float
    in_flight: int
    kv_usage: float | None
    bound_sessions: int

    @property
    def load(self) -> float:
        """Scraped running + waiting plus this gateway's in-flight requests (Replica.load)."""
        return self.running + self.waiting + self.in_flight

    @property
    def queued(self) -> float:
        """Requests ahead of a new one: the scraped queue, plus in-flight requests the last
        scrape cannot have seen yet (more in flight than the engine held)."""
        return self.waiting + max(0.0, self.in_flight - self.running - self.waiting)


@dataclass(frozen=True, slots=True)
class RouteContext:
    """One request as the scorers see it, with what the policy read about its session."""

    tenant: str
    session: str
    hints: RouteHints
    current: str | None = None  # the session's assigned replica, when usable
    parent_home: str | None = None  # where the parent session is assigned
    prefix_home: str | None = None  # where the shared prefix was last served


class Filter(Protocol):
    def filter(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[Candidate]: ...


class Scorer(Protocol):
    name: str

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        """One score per candidate, in order; higher is better."""
        ...


class Picker(Protocol):
    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Candidate: ...


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float = 1.0


# --- filters ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSlackFilter:
    """Keep the replicas whose expected queue wait is within ``slack_s`` of the shortest."""

    cost: CostModel
    typical_prefill_tokens: int
    typical_output_tokens: int
    slack_s: float

    def filter(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[Candidate]:
        waits = [
            queue_wait_s(c, self.cost, self.typical_prefill_tokens, self.typical_output_tokens)
            for c in candidates
        ]
        best = min(waits)
        return [c for c, w in zip(candidates, waits, strict=True) if w <= best + self.slack_s]


# --- scorers ---------------------------------------------------------------------------

# KV usage from which a replica admits nobody new until a running request finishes; vLLM
# reports usage with cached-but-unreferenced blocks counted free, so near 1.0 means full.
KV_FULL = 0.95


def queue_wait_s(
    c: Candidate, cost: CostModel, typical_prefill_tokens: int, typical_output_tokens: int
) -> float:
    """Expected seconds before a new request on ``c`` starts: every request queued ahead
    prefills first (``typical_prefill_tokens`` uncached each), and a full KV pool admits
    nobody until a running request has decoded about half its output."""
    wait = c.queued * cost.prefill_s(typical_prefill_tokens)
    if c.kv_usage is not None and c.kv_usage >= KV_FULL:
        decode_step = cost.step_s(0, max(1, round(c.running)), 0)
        wait += decode_step * typical_output_tokens / 2
    return wait


class LoadScorer:
    """Fewer requests is better: minus the replica's load (requests)."""

    name = "load"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [-c.load for c in candidates]


@dataclass(frozen=True, slots=True)
class AffinityBonusScorer:
    """A fixed bonus for the session's assigned replica (in the other scorers' units)."""

    bonus: float
    name: str = "affinity"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [self.bonus if c.url == ctx.current else 0.0 for c in candidates]


@dataclass(frozen=True, slots=True)
class QueueWaitScorer:
    """Minus the expected queue wait, in seconds."""

    cost: CostModel
    typical_prefill_tokens: int
    typical_output_tokens: int
    name: str = "queue_wait"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        return [
            -queue_wait_s(c, self.cost, self.typical_prefill_tokens, self.typical_output_tokens)
            for c in candidates
        ]


@dataclass(frozen=True, slots=True)
class CachedPrefixScorer:
    """The session's affinity, priced: on its assigned replica, the seconds of prefill its
    cached prefix saves, plus a hysteresis share of that and a floor, so a move must win
    clearly and a session does not bounce between two replicas of similar load."""

    cost: CostModel
    hysteresis: float = 0.25
    min_gain_s: float = 0.05
    name: str = "cached_prefix"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        cached = ctx.hints.cached_prefix_tokens
        if cached is None:  # unknown: assume the whole prompt but this turn's reply
            cached = ctx.hints.prompt_tokens
        saved = self.cost.prefill_s(min(cached, ctx.hints.prompt_tokens or cached))
        bonus = saved * (1 + self.hysteresis) + self.min_gain_s
        return [bonus if c.url == ctx.current else 0.0 for c in candidates]


@dataclass(frozen=True, slots=True)
class PrefixScorer:
    """Prefers the replica most likely holding this request's prefix: where a forked
    session's parent lives, or where the same agent's shared prefix (tools and system
    prompt) was last served. Scores the prefill seconds that prefix saves there. The
    session's own replica is the cached-prefix scorer's to price; counting the shared
    prefix there again would count it twice."""

    cost: CostModel
    name: str = "prefix"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        saved = self.cost.prefill_s(ctx.hints.prefix_tokens)
        homes = {ctx.parent_home, ctx.prefix_home} - {None, ctx.current}
        return [saved if c.url in homes else 0.0 for c in candidates]


class FitScorer:
    """Where a new session fits: most free KV, then fewest sessions bound there. In [0, 2]."""

    name = "fit"

    def score(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> list[float]:
        most = max(c.bound_sessions for c in candidates)
        return [
            (1.0 - (c.kv_usage or 0.0)) + (1.0 - c.bound_sessions / (most + 1)) for c in candidates
        ]


# --- pickers ---------------------------------------------------------------------------


class RoundRobinPicker:
    """Ignores scores: the next candidate in turn."""

    def __init__(self) -> None:
        self._next = 0

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Candidate:
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen


class MaxScorePicker:
    """Highest score wins. On a tie the session's current replica stays; other ties rotate,
    so idle replicas share new sessions instead of the first one in the list taking all of
    them until the next scrape shows its load."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Candidate], scores: Sequence[float]
    ) -> Candidate:
        best = max(scores)
        tied = [c for c, s in zip(candidates, scores, strict=True) if s == best]
        for c in tied:
            if c.url == ctx.current:
                return c
        self._turn += 1
        return tied[self._turn % len(tied)]


@dataclass(frozen=True)
class Profile:
    """One filter -> score -> pick pass."""

    scorers: tuple[Weighted, ...]
    picker: Picker
    filters: tuple[Filter, ...] = ()

    def run(self, ctx: RouteContext, candidates: Sequence[Candidate]) -> Candidate:
        found = list(candidates)
        for f in self.filters:
            found = f.filter(ctx, found) or found  # a filter never empties the field
        totals = [0.0] * len(found)
        for w in self.scorers:
            for i, s in enumerate(w.scorer.score(ctx, found)):
                totals[i] += w.weight * s
        return self.picker.pick(ctx, found, totals)


# --- policies --------------------------------------------------------------------------


def candidates(pool: ReplicaPool, exclude: Collection[str]) -> list[Replica]:
    """Filter step: routable replicas (probes pass, breaker admits) not excluded (URLs
    already tried by failover)."""
    found = [r for r in pool.routable() if r.url not in exclude]
    if not found:
        raise NoHealthyReplica(
            f"no healthy replica among {len(pool.replicas)} (excluded: {sorted(exclude)})",
            pool.retry_after_s(),
        )
    return found


def snapshot(replica: Replica, bound: int = 0) -> Candidate:
    m = replica.metrics
    return Candidate(
        url=replica.url,
        running=m.running if m is not None else 0.0,
        waiting=m.waiting if m is not None else 0.0,
        in_flight=replica.in_flight,
        kv_usage=m.kv_cache_usage if m is not None else None,
        bound_sessions=bound,
    )


class RoutingPolicy(ABC):
    name: str
    # Whether `RouteHints.cached_prefix_tokens` matters to it (the gateway reads the
    # session's accounting for it only then).
    uses_cached_prefix: bool = False

    def policy_for(self, tenant: str) -> RoutingPolicy:
        """The policy that routes ``tenant``'s requests: this one (``TenantPolicies``
        hands each tenant to its own)."""
        return self

    async def choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str] = (),
        hints: RouteHints | None = None,
    ) -> Decision:
        """Pick a replica for one request of (tenant, session); raises NoHealthyReplica."""
        decision = await self._choose(tenant, session, pool, exclude, hints or RouteHints())
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
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str],
        hints: RouteHints,
    ) -> Decision: ...


class _ProfilePolicy(RoutingPolicy):
    """A stateless policy: one profile over the candidates."""

    profile: Profile

    async def _choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str],
        hints: RouteHints,
    ) -> Decision:
        found = {r.url: r for r in candidates(pool, exclude)}
        ctx = RouteContext(tenant, session, hints)
        chosen = self.profile.run(ctx, [snapshot(r) for r in found.values()])
        return Decision(found[chosen.url], self.name)


class RoundRobinPolicy(_ProfilePolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self.profile = Profile(scorers=(), picker=RoundRobinPicker())


class LeastLoadedPolicy(_ProfilePolicy):
    name = "least_loaded"

    def __init__(self) -> None:
        self.profile = Profile(scorers=(Weighted(LoadScorer()),), picker=MaxScorePicker())


class _RecentHomes:
    """Where each recently routed key (a session, a shared prefix) was sent, as this
    gateway saw it, and how many keys each replica holds. Bounded: the least recently
    routed keys drop out."""

    def __init__(self, limit: int = 65_536) -> None:
        self._where: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.count: Counter[str] = Counter()
        self._limit = limit

    def get(self, key: tuple[str, str]) -> str | None:
        return self._where.get(key)

    def bind(self, key: tuple[str, str], url: str) -> None:
        self.forget(key)
        self._where[key] = url
        self.count[url] += 1
        while len(self._where) > self._limit:
            _, dropped = self._where.popitem(last=False)
            self.count[dropped] -= 1

    def forget(self, key: tuple[str, str]) -> None:
        old = self._where.pop(key, None)
        if old is not None:
            self.count[old] -= 1


class AssignedSessionPolicy(RoutingPolicy):
    """What every sticky policy does around its scorers: read the session's replica from
    the shared store, run the profile for a new (or displaced) session or for a bound one,
    and write the choice back by compare-and-set with a TTL, so every gateway replica
    agrees. A subclass gives the two profiles, the reason a scored move is logged under,
    and what its scorers need in the context."""

    # Compare-and-set rounds before giving up when other gateways keep winning with
    # replicas this gateway cannot use.
    _MAX_ROUNDS = 3
    # Reason for a move the scorers chose (the session's replica was usable).
    _moved_reason: str

    def __init__(
        self, assignments: AssignmentStore, *, ttl_s: float, new: Profile, bound: Profile
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._store = assignments
        self.ttl_s = ttl_s
        self._new = new
        self._bound_profile = bound
        self.bound = _RecentHomes()

    def profile_for(self, ctx: RouteContext) -> Profile:
        """The profile handler: new (or displaced) sessions and bound ones differ."""
        return self._new if ctx.current is None else self._bound_profile

    async def context(
        self, tenant: str, session: str, hints: RouteHints, current: str | None
    ) -> RouteContext:
        return RouteContext(tenant, session, hints, current=current)

    async def _choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str],
        hints: RouteHints,
    ) -> Decision:
        found = candidates(pool, exclude)
        usable = {r.url: r for r in found}
        views = [snapshot(r, self.bound.count[r.url]) for r in found]
        if hints.assignment_read:
            current = hints.assignment
        else:
            current = await self._store.get_assignment(tenant, session)
        for _ in range(self._MAX_ROUNDS):
            displaced = _displaced(pool, current, usable, exclude)
            ctx = await self.context(tenant, session, hints, current if displaced is None else None)
            chosen = self.profile_for(ctx).run(ctx, views)
            target = usable[chosen.url]
            if current is None:
                reason = "new"
            elif displaced is not None:
                reason = displaced
            else:
                reason = "sticky" if target.url == current else self._moved_reason
            if hints.assignment_read:  # the caller writes it
                self._bound_to(ctx, target.url)
                return Decision(target, reason, moved_from=None if reason == "sticky" else current)
            # "sticky" keeps the replica: the write then only refreshes the TTL, unless
            # another gateway moved the session meanwhile.
            winner = await self._store.set_assignment(
                tenant, session, target.url, expected=current, ttl_s=self.ttl_s
            )
            if winner == target.url:
                self._bound_to(ctx, target.url)
                return Decision(target, reason, moved_from=None if reason == "sticky" else current)
            # Another gateway changed the assignment first; follow it when we can use it
            # (its move is already recorded there), else decide again against its value.
            if winner in usable:
                self._bound_to(ctx, winner)
                return Decision(usable[winner], "followed")
            current = winner
        raise NoHealthyReplica(
            f"session {tenant}/{session}: assignment kept changing to unusable replicas"
        )

    def _bound_to(self, ctx: RouteContext, url: str) -> None:
        self.bound.bind((ctx.tenant, ctx.session), url)

    def forget(self, tenant: str, session: str) -> None:
        """The session ended: stop counting it against its replica."""
        self.bound.forget((tenant, session))


def _displaced(
    pool: ReplicaPool, current: str | None, usable: dict[str, Replica], exclude: Collection[str]
) -> str | None:
    """Why the assigned replica cannot keep the session (a reason), or None if it can."""
    if current is None:
        return None
    if pool.get(current) is None:
        return "gone"
    if current in exclude:
        return "excluded"
    if current not in usable:
        return "unhealthy"
    return None


class StickyPolicy(AssignedSessionPolicy):
    """Least loaded, plus an affinity bonus of ``rehome_margin`` requests for the session's
    replica: see the module docstring."""

    name = "sticky"
    _moved_reason = "overloaded"

    def __init__(
        self, assignments: AssignmentStore, *, ttl_s: float = 3600.0, rehome_margin: float = 4.0
    ) -> None:
        if rehome_margin < 0:
            raise ValueError(f"rehome_margin must be >= 0, got {rehome_margin}")
        self.rehome_margin = rehome_margin
        picker = MaxScorePicker()
        super().__init__(
            assignments,
            ttl_s=ttl_s,
            new=Profile(scorers=(Weighted(LoadScorer()),), picker=picker),
            bound=Profile(
                scorers=(Weighted(LoadScorer()), Weighted(AffinityBonusScorer(rehome_margin))),
                picker=picker,
            ),
        )


class CostAwareStickyPolicy(AssignedSessionPolicy):
    """Sticky that prices a move: see the module docstring."""

    name = "sticky_cost"
    uses_cached_prefix = True
    _moved_reason = "queue_cost"

    def __init__(
        self,
        assignments: AssignmentStore,
        cost: CostModel,
        *,
        ttl_s: float = 3600.0,
        typical_prefill_tokens: int = 2048,
        typical_output_tokens: int = 256,
        hysteresis: float = 0.25,
        min_gain_s: float = 0.05,
        new_session_slack_s: float | None = None,
    ) -> None:
        self.cost = cost
        waits = (cost, typical_prefill_tokens, typical_output_tokens)
        # New sessions: near-shortest queue, then best fit. "Near" is one typical request's
        # prefill, the granularity the queue estimate has anyway.
        slack = (
            cost.prefill_s(typical_prefill_tokens)
            if new_session_slack_s is None
            else new_session_slack_s
        )
        super().__init__(
            assignments,
            ttl_s=ttl_s,
            new=Profile(
                filters=(QueueSlackFilter(*waits, slack),),
                scorers=(Weighted(FitScorer()), Weighted(PrefixScorer(cost), 1.0)),
                picker=MaxScorePicker(),
            ),
            bound=Profile(
                scorers=(
                    Weighted(QueueWaitScorer(*waits)),
                    Weighted(CachedPrefixScorer(cost, hysteresis, min_gain_s)),
                    Weighted(PrefixScorer(cost)),
                ),
                picker=MaxScorePicker(),
            ),
        )
        # Where each shared prefix was last served (this gateway's view).
        self._prefix_home = _RecentHomes()

    async def context(
        self, tenant: str, session: str, hints: RouteHints, current: str | None
    ) -> RouteContext:
        parent = (
            await self._store.get_assignment(tenant, hints.parent_session)
            if hints.parent_session
            else None
        )
        home = self._prefix_home.get((tenant, hints.prefix_key)) if hints.prefix_key else None
        return RouteContext(
            tenant, session, hints, current=current, parent_home=parent, prefix_home=home
        )

    def _bound_to(self, ctx: RouteContext, url: str) -> None:
        super()._bound_to(ctx, url)
        if ctx.hints.prefix_key:
            self._prefix_home.bind((ctx.tenant, ctx.hints.prefix_key), url)


_POLICIES: dict[str, type[RoutingPolicy]] = {
    p.name: p for p in (StickyPolicy, CostAwareStickyPolicy, RoundRobinPolicy, LeastLoadedPolicy)
}
POLICY_NAMES: tuple[str, ...] = tuple(sorted(_POLICIES))


def make_policy(
    name: str,
    *,
    assignments: AssignmentStore | None = None,
    ttl_s: float = 3600.0,
    rehome_margin: float = 4.0,
    cost: CostModel | None = None,
) -> RoutingPolicy:
    """Build a policy by config name. The store and TTL matter only to the sticky ones,
    the margin only to ``sticky``, the cost model only to ``sticky_cost``."""
    if name not in _POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(_POLICIES))}")
    if name in (StickyPolicy.name, CostAwareStickyPolicy.name):
        if assignments is None:
            raise ValueError(f"routing policy {name!r} needs an assignment store")
        if name == StickyPolicy.name:
            return StickyPolicy(assignments, ttl_s=ttl_s, rehome_margin=rehome_margin)
        if cost is None:
            raise ValueError("routing policy 'sticky_cost' needs a cost model")
        return CostAwareStickyPolicy(assignments, cost, ttl_s=ttl_s)
    return _POLICIES[name]()
