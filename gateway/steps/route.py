"""Route: what the routing policy is told about a request, and what it chose, stored.

The policy (``router.policies``) picks the replica; the session's assignment it keeps
(sticky policies) is read with the history (``ingest.lookup``) and written with it
(``ingest.store_history``), so routing costs no store round trip of its own. The write is
a compare-and-set against the assignment read: when another gateway moved the session
meanwhile, its value stays. The hints and the write are ``router.session_route``'s, the
functions the simulator calls too: this module only reads them out of the request.
"""

from __future__ import annotations

from gateway.steps.ingest import Ingested
from gateway.steps.render_call import Rendering
from router import RouteHints, RoutingPolicy
from router.replica import Replica
from router.session_route import assignment_write, route_hints, shared_prefix
from store import Assign

LAST_PROMPT = "last_prompt_tokens"


def hints(
    policy: RoutingPolicy, ingested: Ingested, rendering: Rendering, assignment: str | None
) -> RouteHints:
    """The rendered prompt's size, the session's cached prefix (its last prompt, from the
    branch's counters), the shared prefix of the rendered prompt (tools and leading system
    messages, keyed per tenant), each when the tenant's policy reads it, and the session's
    ``assignment`` (as read, or as stored with the history)."""
    tenant = ingested.tenant
    return route_hints(
        policy,
        tenant,
        prompt_tokens=rendering.tokens,
        last_prompt_tokens=ingested.found.counts.get(LAST_PROMPT),
        assignment=assignment,
        prefix=lambda: shared_prefix(tenant, rendering.transcript),
    )


def assignment(
    policy: RoutingPolicy, ingested: Ingested, replica: Replica, expected: str | None
) -> Assign | None:
    """The assignment to write with the history: the replica that accepted the request,
    in place of ``expected`` (as read, or as the last write left it), when the tenant's
    policy keeps sessions on replicas."""
    return assignment_write(policy, ingested.tenant, replica.url, expected)
