"""A caller that reads and writes the session's assignment itself (the gateway, with the
session's history): the sticky policies decide from its value and touch no store."""

from __future__ import annotations

from router import CostAwareStickyPolicy, RouteHints, StickyPolicy, get_preset
from tests.router.support import static_pool


class NoStore:
    """An assignment store that must not be used."""

    async def get_assignment(self, tenant: str, session: str) -> str | None:
        raise AssertionError("the policy read the assignment the caller had read")

    async def set_assignment(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("the policy wrote the assignment the caller writes")


async def test_a_caller_read_assignment_is_used_and_not_written() -> None:
    pool = static_pool([0, 3])
    a, b = pool.replicas
    for policy in (
        StickyPolicy(NoStore(), rehome_margin=4),
        CostAwareStickyPolicy(NoStore(), get_preset("cpu-tiny")),
    ):
        new = await policy.choose("t", "s", pool, hints=RouteHints(assignment_read=True))
        assert new.reason == "new" and new.replica in (a, b)
        kept = RouteHints(assignment=b.url, assignment_read=True, cached_prefix_tokens=10_000)
        stays = await policy.choose("t", "s", pool, hints=kept)
        assert (stays.replica, stays.reason) == (b, "sticky")
        b.healthy = False
        moved = await policy.choose("t", "s", pool, hints=kept)
        assert (moved.replica, moved.reason, moved.moved_from) == (a, "unhealthy", b.url)
        b.healthy = True
