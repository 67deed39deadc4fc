"""A caller that reads and writes the session's assignment itself (the gateway, with the
session's history): the sticky policies decide from its value and touch no store."""

from __future__ import annotations

import asyncio
from collections import Counter

from router import RouteHints, get_preset, make_policy
from router.failover import with_failover
from router.replica import Replica
from tests.router.support import NoStore, static_pool


async def test_a_caller_read_assignment_is_used_and_not_written() -> None:
    pool = static_pool([0, 3])
    a, b = pool.replicas
    for policy in (
        make_policy("sticky", assignments=NoStore(), rehome_margin=4),
        make_policy("sticky_cost", assignments=NoStore(), cost=get_preset("cpu-tiny")),
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


async def test_a_burst_of_new_sessions_spreads_over_idle_replicas() -> None:
    """Sessions that arrive together are placed before any scrape sees them: each one's
    placement (its in-flight count, its bound session) must already weigh on the next
    decision, so the burst spreads instead of landing on whichever replica looked idle (a
    quick-profile run before the request path read the assignment with the history put 4
    of 5 new sessions on one replica)."""
    for policy in (
        make_policy("sticky", assignments=NoStore(), rehome_margin=4),
        make_policy("sticky_cost", assignments=NoStore(), cost=get_preset("cpu-tiny")),
    ):
        pool = static_pool([0, 0])
        release = asyncio.Event()

        async def attempt(replica: Replica, release: asyncio.Event = release) -> str:
            await release.wait()  # every request is still in flight when the next routes
            return replica.url

        hints = RouteHints(assignment_read=True, prompt_tokens=2_000)
        runs = [
            asyncio.create_task(with_failover(policy, pool, "t", f"s{i}", attempt, hints=hints))
            for i in range(6)
        ]
        for _ in range(100):  # let every request route
            if sum(r.in_flight for r in pool.replicas) == len(runs):
                break
            await asyncio.sleep(0)
        release.set()
        placed = Counter(await asyncio.gather(*runs))
        assert sorted(placed.values()) == [3, 3], (policy.name, placed)
