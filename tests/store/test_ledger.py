"""The ledger contract (store.ledger: counters, request logs, quota charges), run against
every backend (real Redis, SQLite)."""

from __future__ import annotations

import asyncio

import pytest

from store import Charge, NotFound, Refusal, SessionStore
from tests.store.conftest import StoreFactory, history, msg


async def test_counts_add_up_and_a_retry_adds_nothing(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    try:
        await a.ingest(tenant, "s", history(2))
        await a.ingest(tenant, "s", [*history(1), msg("assistant", "fork")])
        assert await a.get_counts(tenant, "s", 0) == {}
        await a.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r1")
        await b.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r1")  # retry
        await b.add_counts(tenant, "s", 0, {"requests": 1, "tokens": 40}, token="r2")  # equal
        await a.add_counts(tenant, "s", 1, {"requests": 1, "tokens": -5}, token="r3")
        await a.add_counts(tenant, "s", 0, {}, token="r6", latest={"last": 7})
        await b.add_counts(tenant, "s", 0, {}, token="r7", latest={"last": 3})  # set, not added
        assert await b.get_counts(tenant, "s", 0) == {"requests": 2, "tokens": 80, "last": 3}
        assert await a.get_counts(tenant, "s", 1) == {"requests": 1, "tokens": -5}
        assert await b.get_tenant_counts(tenant) == {"requests": 3, "tokens": 75}
        # a session gone: the tenant still counts the request
        await a.add_counts(tenant, "gone", 0, {"requests": 1}, token="r4")
        assert (await a.get_tenant_counts(tenant))["requests"] == 4
        with pytest.raises(NotFound):
            await a.get_counts(tenant, "gone", 0)
        with pytest.raises(NotFound):
            await a.get_counts(tenant, "s", 2)
        with pytest.raises(ValueError, match="must be an int"):
            await a.add_counts(tenant, "s", 0, {"requests": 1.5}, token="r5")  # type: ignore[dict-item]
        assert await a.get_tenant_counts(f"{tenant}-other") == {}
    finally:
        await a.close()
        await b.close()


async def test_counting_appends_one_log_record_per_token(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    try:
        await a.ingest(tenant, "s", history(2))
        await a.ingest(tenant, "s", [*history(1), msg("assistant", "fork")])
        assert await a.get_log(tenant, "s", 0) == []
        await a.add_counts(tenant, "s", 0, {"requests": 1}, token="r1", record=b"first")
        await b.add_counts(tenant, "s", 0, {"requests": 1}, token="r1", record=b"first")  # retry
        await b.add_counts(tenant, "s", 0, {"requests": 1}, token="r2", record=b"first")  # equal
        await a.add_counts(tenant, "s", 1, {"requests": 1}, token="r3", record=b"fork")
        await a.add_counts(tenant, "s", 0, {"requests": 1}, token="r4")  # no record
        assert await b.get_log(tenant, "s", 0) == [b"first", b"first"]
        assert await a.get_log(tenant, "s", 1) == [b"fork"]
        with pytest.raises(NotFound):
            await a.get_log(tenant, "s", 2)
        with pytest.raises(NotFound):
            await a.get_log(tenant, "gone", 0)
    finally:
        await a.close()
        await b.close()


async def test_64_concurrent_counts_all_land(make_store: StoreFactory, tenant: str) -> None:
    replicas = [make_store(), make_store()]
    try:
        await replicas[0].ingest(tenant, "s", history(2))
        await asyncio.gather(
            *(
                replicas[i % 2].add_counts(tenant, "s", 0, {"requests": 1}, token=f"req-{i}")
                for i in range(64)
            )
        )
        assert await replicas[1].get_counts(tenant, "s", 0) == {"requests": 64}
    finally:
        for r in replicas:
            await r.close()


async def test_charges_hold_their_limits_across_stores(
    make_store: StoreFactory, tenant: str
) -> None:
    a, b = make_store(), make_store()
    minute = 60.0
    try:

        def take(tokens: int) -> list[Charge]:
            return [Charge("req", 1, 3, minute), Charge("tok", tokens, 100, minute)]

        assert await a.charge(tenant, take(60)) is None
        # all or nothing: the token charge fails, so the request is not counted either
        assert await b.charge(tenant, take(50)) == Refusal("tok", 60, 100)
        assert await b.charge(tenant, take(40)) is None
        assert await a.charge(tenant, [Charge("tok", 0, 100, minute)]) == Refusal("tok", 100, 100)
        assert await a.charge(tenant, take(0)) == Refusal("tok", 100, 100)
        assert await a.charge(tenant, [Charge("req", 1, 3, minute)]) is None
        assert await b.charge(tenant, [Charge("req", 1, 3, minute)]) == Refusal("req", 3, 3)
        # another tenant has counters of its own; a short window starts over
        assert await a.charge(f"{tenant}-b", take(100)) is None
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is None
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is not None
        await asyncio.sleep(0.35)
        assert await a.charge(tenant, [Charge("fast", 1, 1, 0.3)]) is None
    finally:
        await a.close()
        await b.close()


async def test_a_gauge_goes_up_and_down(store: SessionStore, tenant: str) -> None:
    results = await asyncio.gather(
        *(store.charge(tenant, [Charge("inflight", 1, 4)]) for _ in range(10))
    )
    assert sum(r is None for r in results) == 4
    assert await store.charge(tenant, [Charge("inflight", -1)]) is None
    assert await store.charge(tenant, [Charge("inflight", 1, 4)]) is None
    assert await store.charge(tenant, [Charge("inflight", 1, 4)]) == Refusal("inflight", 4, 4)
    for _ in range(6):  # more releases than holds never go below zero
        await store.charge(tenant, [Charge("inflight", -1)])
    assert await store.charge(tenant, [Charge("inflight", 4, 4)]) is None


async def test_session_count_limit(store: SessionStore, tenant: str) -> None:
    await store.ingest(tenant, "a", history(2))
    await store.ingest(tenant, "b", history(2))
    req = [Charge("req", 1)]
    assert await store.charge(tenant, req, session="a", max_sessions=2) is None  # a live one
    assert await store.charge(tenant, req, session="c", max_sessions=2) == Refusal("sessions", 2, 2)
    assert await store.charge(tenant, req, session="c", max_sessions=3) is None
    await store.delete_session(tenant, "b")
    assert await store.charge(tenant, req, session="c", max_sessions=2) is None
