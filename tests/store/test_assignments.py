"""The assignments contract (store.assignments), run against every backend (real Redis,
SQLite)."""

from __future__ import annotations

import asyncio

from store import SessionStore


async def test_assignment_compare_and_set(store: SessionStore, tenant: str) -> None:
    assert await store.get_assignment(tenant, "s") is None
    assert await store.set_assignment(tenant, "s", "r1", expected=None, ttl_s=30) == "r1"
    # a second router that thought the session was free loses to the first
    assert await store.set_assignment(tenant, "s", "r2", expected=None, ttl_s=30) == "r1"
    assert await store.set_assignment(tenant, "s", "r2", expected="r3", ttl_s=30) == "r1"
    assert await store.set_assignment(tenant, "s", "r2", expected="r1", ttl_s=30) == "r2"
    assert await store.get_assignment(tenant, "s") == "r2"
    assert await store.get_assignment(tenant, "other") is None


async def test_assignment_expires(store: SessionStore, tenant: str) -> None:
    await store.set_assignment(tenant, "s", "r1", expected=None, ttl_s=0.2)
    await asyncio.sleep(0.35)
    assert await store.get_assignment(tenant, "s") is None
    assert await store.set_assignment(tenant, "s", "r2", expected="r1", ttl_s=30) == "r2"


async def test_concurrent_assignment_has_one_winner(store: SessionStore, tenant: str) -> None:
    won = await asyncio.gather(
        *(store.set_assignment(tenant, "s", f"r{i}", expected=None, ttl_s=30) for i in range(32))
    )
    assert len(set(won)) == 1
    assert await store.get_assignment(tenant, "s") == won[0]
