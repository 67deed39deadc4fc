"""Routing policies: what the gateway and the simulator route through.

Every request is routed in three steps, as llm-d's endpoint picker does: filters drop the
replicas that cannot serve it, scorers give every remaining replica a number, and a picker
takes one (``router.parts``; the parts and the policies composed of them are registered in
``router.registry``). That decision is a pure function of its inputs
(``router.decision``). A policy here is the shell around it: it asks the pool which
replicas are routable (health probes, circuit breakers, failover's exclusions), snapshots
them, reads the session's assignment from the shared store (unless the caller read it,
as the gateway and the simulator do: ``router.session_route``), and after the decision
writes the assignment back (unless the caller writes it), remembers the placement and
advances its pickers' rotation.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from router.assignments import AssignmentStore
from router.decision import Choice, Decider
from router.inputs import RouteHints, RouteInput, snapshot
from router.knobs import ASSIGNMENT_TTL_S, Knobs, MissingKnob
from router.placements import Placements
from router.pool import ReplicaPool
from router.prefix_tree import PrefixTrees
from router.registry import POLICIES, SIMULATED_POLICY_NAMES, PolicySpec
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


class RoutingPolicy(Protocol):
    """What the gateway routes through: one policy, or one per tenant (`TenantPolicies`)."""

    name: str
    # Whether `RouteHints.cached_prefix_tokens` matters to it (the gateway reads the
    # session's accounting for it only then).
    uses_cached_prefix: bool
    # Whether `RouteHints.prefix_key` / `prefix_tokens` matter to it (computed only then).
    uses_shared_prefix: bool

    def policy_for(self, tenant: str) -> RoutingPolicy:
        """The policy that routes ``tenant``'s requests."""
        ...

    async def choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str] = (),
        hints: RouteHints | None = None,
    ) -> Decision:
        """Pick a replica for one request of (tenant, session); raises NoHealthyReplica."""
        ...


def routable(pool: ReplicaPool, exclude: Collection[str]) -> dict[str, Replica]:
    """Routable replicas (probes pass, breaker admits) not excluded (URLs already tried by
    failover), by URL."""
    found = {r.url: r for r in pool.routable() if r.url not in exclude}
    if not found:
        raise NoHealthyReplica(
            f"no healthy replica among {len(pool.replicas)} (excluded: {sorted(exclude)})",
            pool.retry_after_s(),
        )
    return found


class ProfilePolicy:
    """A policy that keeps no session assignment (``round_robin``, ``least_loaded``); the
    base of the sticky ones. Counts every decision under its name and reason."""

    def __init__(
        self,
        decider: Decider,
        knobs: Knobs,
        *,
        uses_cached_prefix: bool = False,
        uses_shared_prefix: bool = False,
    ) -> None:
        self.name = decider.name
        self.decider = decider
        self.knobs = knobs
        self.uses_cached_prefix = uses_cached_prefix
        self.uses_shared_prefix = uses_shared_prefix
        self._turns: Counter[str] = Counter()

    def policy_for(self, tenant: str) -> ProfilePolicy:
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
        hints = hints or RouteHints()
        decision = await self._route(tenant, session, pool, frozenset(exclude), hints)
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

    async def _route(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: frozenset[str],
        hints: RouteHints,
    ) -> Decision:
        usable = routable(pool, exclude)
        views = tuple(snapshot(r) for r in usable.values())
        replicas = frozenset(r.url for r in pool.replicas)
        inp = RouteInput(
            tenant,
            session,
            hints,
            views,
            replicas,
            exclude,
            turns=self.turns(),
            matched=self._matched(usable, hints),
        )
        choice = self._decide(inp)
        return Decision(usable[choice.url], choice.reason)

    def _matched(self, usable: Mapping[str, Replica], hints: RouteHints) -> dict[str, int]:
        """Per usable replica, the prompt tokens its prefix tree holds (none kept here)."""
        return {}

    def turns(self) -> dict[str, int]:
        """Each rotation's turns taken so far (a copy: the decision only reads it)."""
        return dict(self._turns)

    def _decide(self, inp: RouteInput) -> Choice:
        choice = self.decider.decide(inp)
        if choice.turned is not None:
            self._turns[choice.turned] += 1
        return choice


class AssignedSessionPolicy(ProfilePolicy):
    """What every sticky policy does around its decision: read the session's replica from
    the shared store (or take the one the caller read, `RouteHints.assignment_read`),
    decide, and write the choice back by compare-and-set with a TTL, so every gateway
    replica agrees. Remembers which sessions it placed on each replica (the fit scorer's
    bound sessions: a session counts until it drops out of the bounded placements, since
    nothing tells the gateway a session ended) and, with ``shared_prefixes``, where each
    shared prefix was served (the prefix scorer's home)."""

    # Compare-and-set rounds before giving up when other gateways keep winning with
    # replicas this gateway cannot use.
    _MAX_ROUNDS = 3

    def __init__(
        self,
        decider: Decider,
        knobs: Knobs,
        assignments: AssignmentStore,
        *,
        ttl_s: float,
        shared_prefixes: bool = False,
        uses_cached_prefix: bool = False,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        super().__init__(
            decider,
            knobs,
            uses_cached_prefix=uses_cached_prefix,
            uses_shared_prefix=shared_prefixes,
        )
        self._store = assignments
        self.ttl_s = ttl_s
        self.sessions = Placements()
        self.prefixes = Placements() if shared_prefixes else None

    async def _route(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: frozenset[str],
        hints: RouteHints,
    ) -> Decision:
        usable = routable(pool, exclude)
        views = tuple(snapshot(r, self.sessions.count(r.url)) for r in usable.values())
        replicas = frozenset(r.url for r in pool.replicas)
        if hints.assignment_read:
            current = hints.assignment
        else:
            current = await self._store.get_assignment(tenant, session)
        prefix_home = self._prefix_home(tenant, hints)
        for _ in range(self._MAX_ROUNDS):
            inp = RouteInput(
                tenant,
                session,
                hints,
                views,
                replicas,
                exclude,
                assignment=current,
                prefix_home=prefix_home,
                turns=self.turns(),
            )
            choice = self._decide(inp)
            if hints.assignment_read:  # the caller writes it
                self._place(tenant, session, hints, choice.url)
                return Decision(usable[choice.url], choice.reason, choice.moved_from)
            # "sticky" keeps the replica: the write then only refreshes the TTL, unless
            # another gateway moved the session meanwhile.
            winner = await self._store.set_assignment(
                tenant, session, choice.url, expected=current, ttl_s=self.ttl_s
            )
            if winner == choice.url:
                self._place(tenant, session, hints, choice.url)
                return Decision(usable[choice.url], choice.reason, choice.moved_from)
            # Another gateway changed the assignment first; follow it when we can use it
            # (its move is already recorded there), else decide again against its value.
            if winner in usable:
                self._place(tenant, session, hints, winner)
                return Decision(usable[winner], "followed")
            current = winner
        raise NoHealthyReplica(
            f"session {tenant}/{session}: assignment kept changing to unusable replicas"
        )

    def _prefix_home(self, tenant: str, hints: RouteHints) -> str | None:
        """Where the request's shared prefix was last served."""
        if self.prefixes is None or not hints.prefix_key:
            return None
        return self.prefixes.home((tenant, hints.prefix_key))

    def _place(self, tenant: str, session: str, hints: RouteHints, url: str) -> None:
        self.sessions.place((tenant, session), url)
        if self.prefixes is not None and hints.prefix_key:
            self.prefixes.place((tenant, hints.prefix_key), url)


class PrefixTreePolicy(ProfilePolicy):
    """A policy that keeps no assignment but remembers, per replica, the prompts it sent
    there in an approximate prefix tree (vllm-router's ``cache_aware``): the decision reads
    how much of this prompt each replica's tree matches (``RouteInput.matched``), and the
    chosen replica's tree learns the prompt. The trees are trimmed to ``max_tree_size`` every
    ``eviction_interval_s`` of ``clock``."""

    def __init__(self, decider: Decider, knobs: Knobs, clock: Callable[[], float]) -> None:
        super().__init__(decider, knobs)
        cost = knobs.cost_model()
        self.trees = PrefixTrees(cost.block_size, knobs.max_tree_size)
        self._clock = clock
        self._next_eviction = clock() + knobs.eviction_interval_s

    async def _route(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: frozenset[str],
        hints: RouteHints,
    ) -> Decision:
        now = self._clock()
        if now >= self._next_eviction:
            self.trees.evict()
            self._next_eviction = now + self.knobs.eviction_interval_s
        decision = await super()._route(tenant, session, pool, exclude, hints)
        self.trees.insert(decision.replica.url, _chain(hints))
        return decision

    def _matched(self, usable: Mapping[str, Replica], hints: RouteHints) -> dict[str, int]:
        chain = _chain(hints)
        return {url: self.trees.matched(url, chain) for url in usable}


def _chain(hints: RouteHints) -> Sequence[int]:
    return hints.block_chain if hints.block_chain is not None else ()


def make_policy(
    name: str,
    *,
    assignments: AssignmentStore | None = None,
    ttl_s: float = ASSIGNMENT_TTL_S,
    clock: Callable[[], float] = time.monotonic,
    **knobs: Any,
) -> ProfilePolicy:
    """Build a policy by config name from its registered composition. The store and TTL
    matter only to the sticky ones, ``clock`` only to one that keeps a prefix tree (when
    it trims it); ``knobs`` (`Knobs` fields: ``rehome_margin``, ``cost``, ...) only to the
    parts that read them."""
    spec = POLICIES.get(name)
    if spec is None:
        known = ", ".join(SIMULATED_POLICY_NAMES)
        raise ValueError(f"unknown routing policy {name!r}; known: {known}")
    settings = Knobs(**knobs)
    if spec.prefix_tree:
        try:
            return PrefixTreePolicy(_decider(name, spec, settings), settings, clock)
        except MissingKnob as missing:
            raise ValueError(f"routing policy {name!r} needs {missing}") from None
    if spec.bound is None:
        decider = _decider(name, spec, settings)
        return ProfilePolicy(decider, settings, uses_cached_prefix=spec.uses_cached_prefix)
    if assignments is None:
        raise ValueError(f"routing policy {name!r} needs an assignment store")
    return AssignedSessionPolicy(
        _decider(name, spec, settings),
        settings,
        assignments,
        ttl_s=ttl_s,
        shared_prefixes=spec.shared_prefixes,
        uses_cached_prefix=spec.uses_cached_prefix,
    )


def _decider(name: str, spec: PolicySpec, knobs: Knobs) -> Decider:
    """The spec's profiles built from the knobs (a missing knob names the policy)."""
    try:
        new = spec.new.build(knobs)
        bound = None if spec.bound is None else spec.bound.build(knobs)
    except MissingKnob as missing:
        raise ValueError(f"routing policy {name!r} needs {missing}") from None
    return Decider(name, new, bound, spec.moved_reason)
