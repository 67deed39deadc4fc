"""Route: what the routing policy is told about a request, and what it chose, stored.

The policy (``router.policies``) picks the replica; the session's assignment it keeps
(sticky policies) is read with the history (``ingest.lookup``) and written with it
(``ingest.store_history``),
so routing costs no store round trip of its own. The write is a compare-and-set against
the assignment read: when another gateway moved the session meanwhile, its value stays.
"""

from __future__ import annotations

from gateway.steps.ingest import Ingested
from router import AssignedSessionPolicy, RouteHints, RoutingPolicy
from router.replica import Replica
from store import Assign

LAST_PROMPT = "last_prompt_tokens"


def hints(
    policy: RoutingPolicy, ingested: Ingested, prompt_tokens: int, assignment: str | None
) -> RouteHints:
    """The rendered prompt's size, the session's cached prefix (its last prompt, from the
    branch's counters) when the policy prices moves with it, and its ``assignment`` (as
    read, or as stored with the history)."""
    policy = policy.policy_for(ingested.tenant)
    cached = ingested.found.counts.get(LAST_PROMPT) if policy.uses_cached_prefix else None
    return RouteHints(
        prompt_tokens=prompt_tokens,
        cached_prefix_tokens=cached,
        assignment=assignment,
        assignment_read=True,
    )


def assignment(
    policy: RoutingPolicy, ingested: Ingested, replica: Replica, expected: str | None
) -> Assign | None:
    """The assignment to write with the history: the replica that accepted the request,
    in place of ``expected`` (as read, or as the last write left it), when the tenant's
    policy keeps sessions on replicas."""
    policy = policy.policy_for(ingested.tenant)
    if not isinstance(policy, AssignedSessionPolicy):
        return None
    return Assign(replica.url, expected=expected, ttl_s=policy.ttl_s)
