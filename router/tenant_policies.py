"""Routing policies chosen per tenant: one tenant's sessions sticky, another's round-robin.

The gateway routes through one `RoutingPolicy`; when tenants name policies of their own,
it is a `TenantPolicies`, which builds one policy per name in use and hands each request
to its tenant's through that policy's public ``choose``. Each policy keeps its own state
(rotation turns, the sessions it placed on each replica), so a policy's "fewest bound
sessions" counts only its own tenants' sessions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from router.inputs import RouteHints
from router.policies import Decision, RoutingPolicy, make_policy
from router.pool import ReplicaPool


class TenantPolicies:
    """A `RoutingPolicy` that delegates each tenant's requests to that tenant's policy."""

    name = "per_tenant"

    def __init__(self, default: RoutingPolicy, by_tenant: Mapping[str, RoutingPolicy]) -> None:
        self.default = default
        self.by_tenant = dict(by_tenant)
        # The gateway reads the session's accounting for this hint only when it matters
        # to some policy; the others ignore it.
        policies = (default, *self.by_tenant.values())
        self.uses_cached_prefix = any(p.uses_cached_prefix for p in policies)
        self.uses_shared_prefix = any(p.uses_shared_prefix for p in policies)

    def policy_for(self, tenant: str) -> RoutingPolicy:
        """The tenant's own policy, else the default one."""
        return self.by_tenant.get(tenant, self.default)

    async def choose(
        self,
        tenant: str,
        session: str,
        pool: ReplicaPool,
        exclude: Collection[str] = (),
        hints: RouteHints | None = None,
    ) -> Decision:
        """The tenant's policy decides (and is counted under its own name)."""
        return await self.policy_for(tenant).choose(tenant, session, pool, exclude, hints)


def make_tenant_policy(default: str, by_tenant: Mapping[str, str], **options: Any) -> RoutingPolicy:
    """The policy named ``default``, or, when tenants name others, a `TenantPolicies` over
    one policy per name. ``options`` go to `make_policy`."""
    if not by_tenant:
        return make_policy(default, **options)
    built = {name: make_policy(name, **options) for name in {default, *by_tenant.values()}}
    return TenantPolicies(
        built[default], {tenant: built[name] for tenant, name in by_tenant.items()}
    )
