"""The gateway's request path around the policy as the simulator runs it, step for step.

For each request the gateway reads the session's assignment with its history, builds the
hints, adds what the replicas' KV events say (``kv_events``) and whether the session is
warm (its vLLM priority), asks working-set admission about the session's replica (waiting
at the gateway while refused), lets the policy decide without touching a store, counts the
request in flight on the replica, at the first chunk moves the session's admission share
where the policy placed it and writes the assignment with the history, and at the reply's
end counts it out and ends its admission share. ``SimRouting`` does the same through the
same functions (``router.session_route``, ``router.admission_seam``, the policy's
``choose``, ``Replica.started``/``ended``) over an in-memory store with the store's
compare-and-set, so the simulator decides as the gateway does
(``tests/offline/test_one_routing_path.py`` replays one sequence through both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.steps.priority import upstream_priority
from offline.sim.assignments import MemoryAssignments, run_sync
from router import Decision, ReplicaPool, RouteHints, RoutingPolicy
from router.admission_seam import (
    Admission,
    AdmissionRequest,
    AdmissionVerdict,
    FirstToken,
    admission_request,
    binds_placement,
    relocate,
)
from router.inputs import Candidate, snapshot
from router.replica import Replica
from router.session_route import (
    SharedPrefix,
    assignment_write,
    prefill_estimate,
    route_hints,
    session_warm,
    with_resident,
)
from router.working_set_admission import WorkingSetAdmission

ADMITTED = AdmissionVerdict(True)


@dataclass(slots=True)
class Routed:
    """One request on the gateway's path: the assignment read before it (what the commit's
    compare-and-set expects), its hints, when it first asked admission, its admission
    request once admitted (None: no admission, or none was asked), its vLLM priority, the
    policy's decision once routed, and the prefill it counts on its replica's backlog until
    its first token (``prefill_estimate``: None without the KV events)."""

    tenant: str
    session: str
    expected: str | None
    hints: RouteHints
    asked_at: float
    priority: int = 0
    admitted: AdmissionRequest | None = None
    decision: Decision | None = None
    prefill: int | None = None  # its prefill counted as its replica's backlog, if sized

    @property
    def replica(self) -> Replica:
        assert self.decision is not None, "not routed yet"
        return self.decision.replica


class SimRouting:
    def __init__(
        self,
        policy: RoutingPolicy,
        pool: ReplicaPool,
        assignments: MemoryAssignments,
        admission: Admission | None,
        *,
        free: Callable[[Candidate, float], tuple[int, int]] | None = None,
        priority: bool = False,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.assignments = assignments
        self.admission = admission  # None: admission off (the gateway asks nothing)
        # Where a session without a routable replica is asked for: the most room beside
        # the replica's working set (the gateway's ``WorkingSetAdmission.free_tokens``).
        if free is None and isinstance(admission, WorkingSetAdmission):
            free = admission.free_tokens
        self.free = free or (lambda c, now: (0, 0))
        self.priority = priority  # the gateway's upstream_priority

    def prepare(
        self,
        tenant: str,
        session: str,
        *,
        prompt_tokens: int,
        last_prompt_tokens: int | None,
        prefix: SharedPrefix | None,
        now: float,
        block_chain: Sequence[int] | None = None,
        resident: Mapping[str, int] | None = None,
    ) -> Routed:
        """Read the assignment (the gateway's history lookup), build the hints with what
        the replicas hold (``resident``: the KV events' figure, None without them), and
        the session's priority."""
        expected = self.assignments.read(tenant, session)
        hints = route_hints(
            self.policy,
            tenant,
            prompt_tokens=prompt_tokens,
            last_prompt_tokens=last_prompt_tokens,
            assignment=expected,
            prefix=lambda: prefix,
            block_chain=block_chain,
        )
        hints = with_resident(hints, expected, resident)
        admission = self.admission
        holds = (
            (lambda: admission.holds(tenant, session, expected or "", now))
            if isinstance(admission, WorkingSetAdmission)
            else None
        )
        warm = session_warm(expected, last_prompt_tokens, resident, holds)
        priority = upstream_priority(0, warm) if self.priority else 0
        return Routed(tenant, session, expected, hints, now, priority)

    def admit(self, routed: Routed, now: float) -> AdmissionVerdict:
        """Ask working-set admission for the session's replica (before the policy routes);
        admitted, its share starts there."""
        admission = self.admission
        if admission is None:
            return ADMITTED
        request = admission_request(
            routed.tenant,
            routed.session,
            routed.expected,
            routed.hints.prompt_tokens,
            tuple(snapshot(r) for r in self.pool.routable()),
            now=now,
            since=routed.asked_at,
            free=lambda c: self.free(c, now),
        )
        if request is None:
            return ADMITTED
        verdict = admission.decide(request)
        if verdict.admit:
            admission.started(request)
            routed.admitted = request
            if binds_placement(request, verdict.reason):  # as the gateway's KV step
                routed.hints = replace(routed.hints, admitted=request.replica)
        return verdict

    def route(self, routed: Routed) -> Decision:
        """The policy decides; the request counts in flight on its replica, and its prefill
        there as backlog until its first token (as the gateway's attempt counts it until
        the first chunk, ``Replica.prefill``)."""
        decision = run_sync(
            self.policy.choose(routed.tenant, routed.session, self.pool, hints=routed.hints)
        )
        routed.decision = decision
        decision.replica.started()
        routed.prefill = prefill_estimate(routed.hints, decision.replica.url)
        if routed.prefill is not None:
            decision.replica.prefill_started(routed.prefill)
        return decision

    def replayed(self, routed: Routed, replica: Replica) -> Decision:
        """A request sent where a measured run's log says, bypassing the policy."""
        routed.decision = Decision(replica, "replayed")
        replica.started()
        return routed.decision

    def accepted(self, routed: Routed, now: float) -> None:
        """The replica sent the first token: the session's admission share moves to it
        where the policy placed it elsewhere, and the assignment is written with the
        history."""
        url = routed.replica.url
        if routed.prefill is not None:
            routed.replica.prefill_ended(routed.prefill)
        if self.admission is not None and routed.admitted is not None:
            routed.admitted = relocate(self.admission, routed.admitted, url, now)
        assign = assignment_write(self.policy, routed.tenant, url, routed.expected)
        if assign is not None:
            self.assignments.write(routed.tenant, routed.session, assign)

    def ended(
        self,
        routed: Routed,
        now: float,
        first_token: FirstToken | None = None,
        *,
        pausing: bool = True,
    ) -> None:
        """The reply ended: served, so the session's footprint is reserved through its
        pause unless the reply ended the agent's turn (``pausing`` False); ``first_token``
        as the gateway measures it (``gateway.steps.kv``)."""
        routed.replica.ended()
        if self.admission is not None and routed.admitted is not None:
            request = routed.admitted
            self.admission.ended(
                request.tenant, request.session, request.replica, now,
                first_token=first_token, pausing=pausing,
            )  # fmt: skip
