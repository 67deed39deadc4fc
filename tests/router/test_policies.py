import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from router import (
    AssignedSessionPolicy,
    AssignmentStore,
    NoHealthyReplica,
    ProfilePolicy,
    ReplicaMetrics,
    make_policy,
)
from tests.router.support import static_pool


def moves(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "foldgate_router_session_moves_total", {"policy": "sticky", "reason": reason}
    )
    return value or 0.0


async def test_round_robin_cycles_over_healthy_replicas() -> None:
    pool = static_pool([0, 0, 0], healthy=[True, False, True])
    policy = make_policy("round_robin")
    picked = [(await policy.choose("t", "s", pool)).replica.url for _ in range(4)]
    a, _, c = (r.url for r in pool.replicas)
    assert picked == [a, c, a, c]


async def test_round_robin_respects_exclude() -> None:
    pool = static_pool([0, 0])
    a, b = (r.url for r in pool.replicas)
    policy = make_policy("round_robin")
    assert {(await policy.choose("t", "s", pool, exclude=[a])).replica.url for _ in range(3)} == {b}


async def test_least_loaded_counts_scrape_and_in_flight() -> None:
    pool = static_pool([3, 1, 2])
    policy = make_policy("least_loaded")
    assert (await policy.choose("t", "s", pool)).replica is pool.replicas[1]
    pool.replicas[1].in_flight = 5  # 1 + 5 > 2
    assert (await policy.choose("t", "s", pool)).replica is pool.replicas[2]


async def test_least_loaded_ties_rotate() -> None:
    pool = static_pool([0, 0, 7])
    policy = make_policy("least_loaded")
    picked = {(await policy.choose("t", "s", pool)).replica.url for _ in range(4)}
    assert picked == {pool.replicas[0].url, pool.replicas[1].url}


async def test_no_healthy_replica_is_an_error(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 0], healthy=[False, False])
    for policy in (
        make_policy("round_robin"),
        make_policy("least_loaded"),
        make_policy("sticky", assignments=assignments),
    ):
        with pytest.raises(NoHealthyReplica, match="no healthy replica among 2"):
            await policy.choose("t", "s", pool)


async def test_sticky_new_session_goes_to_least_loaded_and_stays(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([4, 1, 3])
    policy = make_policy("sticky", assignments=assignments, rehome_margin=4)
    first = await policy.choose("t", "s1", pool)
    assert (first.replica, first.reason, first.moved_from) == (pool.replicas[1], "new", None)
    assert await assignments.get_assignment("t", "s1") == pool.replicas[1].url
    # Now busier than the others, but within the margin: the session keeps its cache.
    pool.replicas[1].metrics = ReplicaMetrics(running=7, waiting=0)
    again = await policy.choose("t", "s1", pool)
    assert (again.replica, again.reason, again.moved_from) == (pool.replicas[1], "sticky", None)


async def test_sticky_rehomes_from_unhealthy_replica_and_records_it(
    assignments: AssignmentStore,
) -> None:
    pool = static_pool([0, 3])
    a, b = pool.replicas
    policy = make_policy("sticky", assignments=assignments, rehome_margin=4)
    assert (await policy.choose("t", "s", pool)).replica is a
    before = moves("unhealthy")
    a.healthy = False
    moved = await policy.choose("t", "s", pool)
    assert (moved.replica, moved.reason, moved.moved_from) == (b, "unhealthy", a.url)
    assert await assignments.get_assignment("t", "s") == b.url
    assert moves("unhealthy") == before + 1
    # Recovery does not pull the session back: b's cache is the warm one now.
    a.healthy = True
    assert (await policy.choose("t", "s", pool)).replica is b


async def test_sticky_rehomes_when_load_exceeds_margin(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 1])
    a, b = pool.replicas
    policy = make_policy("sticky", assignments=assignments, rehome_margin=2)
    assert (await policy.choose("t", "s", pool)).replica is a
    a.in_flight = 3  # load 3 vs 1: over by 2, not more
    assert (await policy.choose("t", "s", pool)).reason == "sticky"
    a.in_flight = 4  # over by 3
    moved = await policy.choose("t", "s", pool)
    assert (moved.replica, moved.reason, moved.moved_from) == (b, "overloaded", a.url)


async def test_sticky_excluded_replica_moves_session(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 0])
    policy = make_policy("sticky", assignments=assignments)
    first = (await policy.choose("t", "s", pool)).replica
    moved = await policy.choose("t", "s", pool, exclude=[first.url])
    assert moved.reason == "excluded" and moved.moved_from == first.url
    assert moved.replica is not first


async def test_sticky_assignment_expires_after_ttl(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 0])
    policy = make_policy("sticky", assignments=assignments, ttl_s=0.05)
    await policy.choose("t", "s", pool)
    await asyncio.sleep(0.1)
    assert (await policy.choose("t", "s", pool)).reason == "new"


async def test_sticky_sessions_are_per_tenant(assignments: AssignmentStore) -> None:
    pool = static_pool([0, 0])
    policy = make_policy("sticky", assignments=assignments)
    first = (await policy.choose("t1", "s", pool)).replica
    pool.replicas[pool.replicas.index(first)].in_flight = 1
    assert (await policy.choose("t2", "s", pool)).replica is not first


async def test_two_gateways_sharing_a_store_agree(assignments: AssignmentStore) -> None:
    # Each gateway sees different loads, so left alone they would pick different replicas
    # for a new session; the differences stay within the margin, so neither moves the other's.
    pool1 = static_pool([0, 3, 3])
    pool2 = static_pool([3, 0, 3])
    g1, g2 = (
        make_policy("sticky", assignments=assignments, rehome_margin=4),
        make_policy("sticky", assignments=assignments, rehome_margin=4),
    )
    sessions = [f"s{i}" for i in range(20)]
    calls = [g.choose("t", s, p) for s in sessions for g, p in ((g1, pool1), (g2, pool2))]
    decisions = await asyncio.gather(*calls)
    for i, s in enumerate(sessions):
        d1, d2 = decisions[2 * i], decisions[2 * i + 1]
        assert d1.replica.url == d2.replica.url == await assignments.get_assignment("t", s)
    assert any(d.reason == "followed" for d in decisions)


async def test_follows_winner_only_when_usable(assignments: AssignmentStore) -> None:
    # Gateway 2 cannot reach replica 0, which gateway 1 just assigned: it re-homes instead.
    pool1 = static_pool([0, 5])
    pool2 = static_pool([0, 5], healthy=[False, True])
    await make_policy("sticky", assignments=assignments).choose("t", "s", pool1)
    d = await make_policy("sticky", assignments=assignments).choose("t", "s", pool2)
    assert (d.replica.url, d.reason) == (pool2.replicas[1].url, "unhealthy")


async def test_make_policy(assignments: AssignmentStore) -> None:
    for name in ("round_robin", "least_loaded"):
        policy = make_policy(name, assignments=assignments)
        assert policy.name == name and not isinstance(policy, AssignedSessionPolicy)
        assert isinstance(policy, ProfilePolicy)
    sticky = make_policy("sticky", assignments=assignments, ttl_s=5, rehome_margin=1)
    assert isinstance(sticky, AssignedSessionPolicy)
    assert (sticky.name, sticky.ttl_s, sticky.knobs.rehome_margin) == ("sticky", 5, 1)
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="needs an assignment store"):
        make_policy("sticky")
    with pytest.raises(ValueError, match="ttl_s must be positive"):
        make_policy("sticky", assignments=assignments, ttl_s=0)
    with pytest.raises(ValueError, match="rehome_margin must be >= 0"):
        make_policy("sticky", assignments=assignments, rehome_margin=-1)


# The store fixture outlives examples; each example uses a session of its own.
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, 10), min_size=3, max_size=3),
            st.lists(st.booleans(), min_size=3, max_size=3).filter(any),
        ),
        min_size=1,
        max_size=8,
    ),
    margin=st.integers(0, 5),
)
async def test_sticky_invariants_under_changing_health_and_load(
    assignments: AssignmentStore, steps: list[tuple[list[int], list[bool]]], margin: int
) -> None:
    session = uuid.uuid4().hex
    policy = make_policy("sticky", assignments=assignments, rehome_margin=margin)
    pool = static_pool([0, 0, 0])
    previous: str | None = None
    for loads, healthy in steps:
        for replica, load, up in zip(pool.replicas, loads, healthy, strict=True):
            replica.metrics, replica.healthy = ReplicaMetrics(running=load, waiting=0), up
        d = await policy.choose("t", session, pool)
        least = min(r.load for r in pool.healthy())
        assert d.replica.healthy
        assert d.replica.load <= least + margin
        assert await assignments.get_assignment("t", session) == d.replica.url
        # A session moves only when it has to, and every move is recorded.
        stayed = previous == d.replica.url
        assert stayed == (d.reason == "sticky")
        assert d.moved_from == (None if stayed else previous)
        previous = d.replica.url
