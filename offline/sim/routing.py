"""The gateway's routing path as the simulator runs it, step for step.

For each request the gateway reads the session's assignment with its history, builds the
hints, lets the policy decide without touching a store, asks the admission seam, counts the
request in flight on the replica, writes the assignment with the history once the replica
sent its first chunk (the commit), and counts it out when the reply ends. ``SimRouting``
does the same through the same functions (``router.session_route``, the policy's
``choose``, ``router.admission_seam``, ``Replica.started``/``ended``) over an in-memory
store with the store's compare-and-set, so the simulator routes as the gateway does
(``tests/offline/test_one_routing_path.py`` replays one sequence through both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offline.sim.assignments import MemoryAssignments, run_sync
from router import Decision, ReplicaPool, RoutingPolicy
from router.admission_seam import Admission, AdmissionRequest, AdmissionVerdict
from router.inputs import snapshot
from router.replica import Replica
from router.session_route import SharedPrefix, assignment_write, route_hints


@dataclass(slots=True)
class Routed:
    """One routed request: its decision, the assignment read before it (what the commit's
    compare-and-set expects) and when it was routed (for its admission wait)."""

    tenant: str
    session: str
    decision: Decision
    expected: str | None
    prompt_tokens: int
    cached_prefix_tokens: int | None
    routed_at: float

    @property
    def replica(self) -> Replica:
        return self.decision.replica


class SimRouting:
    def __init__(
        self,
        policy: RoutingPolicy,
        pool: ReplicaPool,
        assignments: MemoryAssignments,
        admission: Admission,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.assignments = assignments
        self.admission = admission

    def route(
        self,
        tenant: str,
        session: str,
        *,
        prompt_tokens: int,
        last_prompt_tokens: int | None,
        prefix: SharedPrefix | None,
        now: float,
        block_chain: Sequence[int] | None = None,
    ) -> Routed:
        """Read the assignment (the gateway's history lookup), build the hints, decide."""
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
        decision = run_sync(self.policy.choose(tenant, session, self.pool, hints=hints))
        cached = hints.cached_prefix_tokens
        return Routed(tenant, session, decision, expected, prompt_tokens, cached, now)

    def replayed(self, tenant: str, session: str, replica: Replica, now: float) -> Routed:
        """A request sent where a measured run's log says, bypassing the policy."""
        decision = Decision(replica, "replayed")
        return Routed(tenant, session, decision, None, 0, None, now)

    def admit(self, routed: Routed, now: float) -> AdmissionVerdict:
        """Ask the admission seam; admitted, the request counts in flight on its replica."""
        request = AdmissionRequest(
            routed.tenant,
            routed.session,
            routed.replica.url,
            routed.prompt_tokens,
            routed.cached_prefix_tokens,
            tuple(snapshot(r) for r in self.pool.routable()),
            now,
            now - routed.routed_at,
        )
        verdict = self.admission.decide(request)
        if verdict.admit:
            self.admission.started(request)
            routed.replica.started()
        return verdict

    def accepted(self, routed: Routed) -> None:
        """The replica sent the first token: the assignment is written with the history."""
        assign = assignment_write(self.policy, routed.tenant, routed.replica.url, routed.expected)
        if assign is not None:
            self.assignments.write(routed.tenant, routed.session, assign)

    def ended(self, routed: Routed, now: float) -> None:
        """The reply ended."""
        routed.replica.ended()
        self.admission.ended(routed.tenant, routed.session, routed.replica.url, now)
