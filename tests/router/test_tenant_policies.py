from __future__ import annotations

from router import Decision, TenantPolicies, make_policy, make_tenant_policy
from tests.router.support import static_pool


class NoAssignments:
    async def get_assignment(self, tenant: str, session: str) -> str | None:
        return None

    async def set_assignment(self, tenant, session, replica, *, expected, ttl_s) -> str:
        return replica


async def test_each_tenant_is_routed_by_its_own_policy() -> None:
    pool = static_pool([5, 5, 0])
    policy = TenantPolicies(make_policy("least_loaded"), {"rr": make_policy("round_robin")})
    rr = [(await policy.choose("rr", "s", pool)).replica.url for _ in range(3)]
    assert len(set(rr)) == 3
    least = {(await policy.choose("other", "s", pool)).replica.url for _ in range(3)}
    assert least == {pool.replicas[2].url}


def test_one_policy_unless_tenants_name_others() -> None:
    options = {"assignments": NoAssignments()}
    assert make_tenant_policy("sticky", {}, **options).name == "sticky"
    policy = make_tenant_policy(
        "sticky", {"a": "round_robin", "b": "round_robin", "c": "sticky"}, **options
    )
    assert isinstance(policy, TenantPolicies)
    assert policy.policy_for("a") is policy.policy_for("b")  # one instance per name
    assert policy.policy_for("c") is policy.policy_for("zz") is policy.default
    assert not policy.uses_cached_prefix


def test_the_cached_prefix_hint_is_read_when_any_tenant_needs_it() -> None:
    from router import get_preset

    policy = make_tenant_policy(
        "round_robin",
        {"a": "sticky_cost"},
        assignments=NoAssignments(),
        cost=get_preset("cpu-tiny"),
    )
    assert policy.policy_for("a").name == "sticky_cost"
    assert policy.uses_cached_prefix


async def test_tenant_policies_compose_any_routing_policy_through_its_public_api() -> None:
    pool = static_pool([0, 0])

    class Fixed:
        """A RoutingPolicy of its own: always the second replica."""

        name = "fixed"
        uses_cached_prefix = True
        uses_shared_prefix = False

        def __init__(self) -> None:
            self.calls: list[tuple[str, str, tuple[str, ...]]] = []

        def policy_for(self, tenant: str) -> Fixed:
            return self

        async def choose(self, tenant, session, pool, exclude=(), hints=None) -> Decision:
            self.calls.append((tenant, session, tuple(exclude)))
            return Decision(pool.replicas[1], "fixed")

    fixed = Fixed()
    policy = TenantPolicies(make_policy("round_robin"), {"f": fixed})
    assert policy.uses_cached_prefix
    d = await policy.choose("f", "s", pool, exclude=["x"])
    assert (d.replica, d.reason, fixed.calls) == (pool.replicas[1], "fixed", [("f", "s", ("x",))])
    assert (await policy.choose("other", "s", pool)).reason == "round_robin"
